"""Fine-tune a cross-encoder reranker on relevance judgments; write a folder ``--reranker.model DIR`` serves as it is.

    python -m relevance.train_reranker --data ../shared/data/scifact --train-split train \\
        --index bench/out/indexes/scifact-3 --out models/reranker-scifact
    python -m deployments --index bench/out/indexes/scifact-3 --reranker.model models/reranker-scifact

The same judgments, held-out split and hard negatives as ``relevance.train_encoder`` (see there). The
model (``--base``: the shipped MiniLM's weights with a new one-logit head, or any model named) reads each
(query, document) pair together and is trained listwise: each query's relevant document against its hard
negative and ``--in-batch-negatives`` other queries' documents, a softmax over their sigmoid scores
(sentence-transformers' cross-encoder MultipleNegativesRankingLoss). Trained pointwise (binary
cross-entropy) on a few thousand pairs, the same weights collapsed to one constant score here; a
listwise loss cannot lower itself that way. Scores are served as probabilities (a sigmoid over the logit).

Resumable from ``OUT/checkpoints``; on a GPU when one is present; writes ``OUT`` and ``OUT/training.json``.
"""

from __future__ import annotations

import json
import shutil
import sys
import time

from index_format.process import configure_process
from relevance.training import (
    TRAINING_FILE,
    build_parser,
    last_checkpoint,
    load_pairs,
    training_rows,
)


def main(argv: list[str] | None = None, callbacks: list | None = None) -> int:
    """``callbacks``: extra ``transformers.TrainerCallback`` objects (tests stop a run with one)."""
    ap = build_parser("python -m relevance.train_reranker", __doc__)
    ap.add_argument("--base", default="all-MiniLM-L6-v2",
                    help="the weights to start from: the shipped MiniLM (default), a cross-encoder, or any model")
    ap.add_argument("--in-batch-negatives", type=int, default=4,
                    help="other queries' documents each query is also ranked against (default: %(default)s)")
    ap.add_argument("--max-length", type=int, default=256, help="tokens of a (query, document) pair")
    ap.set_defaults(epochs=1, batch_size=16)
    args = ap.parse_args(argv)
    configure_process()
    import torch
    from datasets import Dataset
    from sentence_transformers.cross_encoder import (
        CrossEncoder,
        CrossEncoderTrainer,
        CrossEncoderTrainingArguments,
    )
    from sentence_transformers.cross_encoder.losses import MultipleNegativesRankingLoss

    from index_format.encoders import resolve_model_path

    started = time.time()
    pairs, data = load_pairs(args)
    rows = training_rows(pairs, args.hard_negatives)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = CrossEncoder(resolve_model_path(args.base), num_labels=1, max_length=args.max_length, device=device)
    checkpoints = args.out / "checkpoints"
    resume = last_checkpoint(checkpoints)
    training_args = CrossEncoderTrainingArguments(
        output_dir=str(checkpoints), num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr, warmup_steps=0.1, seed=args.seed, save_strategy="steps", save_steps=args.save_steps,
        save_total_limit=1, logging_steps=10, report_to=[], disable_tqdm=args.no_progress, use_cpu=device == "cpu")
    loss = MultipleNegativesRankingLoss(model, num_negatives=args.in_batch_negatives)
    trainer = CrossEncoderTrainer(model=model, args=training_args, train_dataset=Dataset.from_dict(rows), loss=loss,
                                  callbacks=callbacks)
    if resume:
        print(f"resuming from {resume}", file=sys.stderr)
    trainer.train(resume_from_checkpoint=resume)
    model.save(str(args.out))
    shutil.rmtree(checkpoints, ignore_errors=True)
    record = {"kind": "reranker", "base": args.base, "data": data, "examples": len(rows["anchor"]),
              "hard_negatives": sum(name.startswith("negative") for name in rows),
              "in_batch_negatives": args.in_batch_negatives,
              "loss": "listwise (MultipleNegativesRankingLoss)", "max_length": args.max_length, "epochs": args.epochs,
              "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed, "device": device,
              "seconds": round(time.time() - started, 1), "resumed_from": resume}
    (args.out / TRAINING_FILE).write_text(json.dumps(record, indent=1) + "\n")
    print(f"trained a reranker from {args.base} on {data['pairs']} pairs of {data['queries']} queries from "
          f"{data['source']} (held out: {data['held_out']}) in {record['seconds']:.0f} s on {device} -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
