"""Fine-tune the query and document encoder on relevance judgments; write a folder index_build takes as it is.

    python -m relevance.train_encoder --data ../shared/data/scifact --train-split train \\
        --index bench/out/indexes/scifact-3 --out models/minilm-scifact
    python -m index_build --corpus ../shared/data/scifact/corpus.jsonl --out indexes/scifact-tuned \\
        --encoder models/minilm-scifact

Judgments: a BEIR folder's qrels of one split (``--data DIR --train-split train``; the test split is held out:
its queries never enter training) or what a running service collected (``--judgments ROOT``, the index
root whose ``judgments/`` ``POST /feedback`` wrote). Each (query, relevant document) pair gets one hard
negative, the best-ranked hybrid candidate of ``--index`` for the query that is not judged relevant, and
the sentence-transformers encoder (``--base``: the shipped MiniLM or any model named) learns with
in-batch negatives (MultipleNegativesRankingLoss: each query's own document against every other document
of its batch and the hard negatives). Queries and documents go through the same encoder, as the index
and the service use it.

Resumable: checkpoints go to ``OUT/checkpoints`` and a rerun of the same command goes on from the last
one. On a GPU when one is present. Writes ``OUT`` (a sentence-transformers folder) and
``OUT/training.json`` (the data, the held-out split, the counts, the settings, the time).
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
    ap = build_parser("python -m relevance.train_encoder", __doc__)
    ap.add_argument("--base", default="all-MiniLM-L6-v2",
                    help="the encoder to start from: the shipped MiniLM (default) or a model name or folder")
    # Twice the reranker's 2e-5: with the trainer's warm-up and linear decay the mean rate is about half the
    # peak, and at 2e-5 the encoder learned too little (SciFact test dense nDCG@10 0.702 at 2e-5, 0.727 at
    # 4e-5; bench/README.md, "Learned from judgments").
    ap.set_defaults(lr=4e-5)
    args = ap.parse_args(argv)
    configure_process()
    import torch
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.losses import MultipleNegativesRankingLoss
    from sentence_transformers.training_args import BatchSamplers

    from index_format.encoders import resolve_model_path

    started = time.time()
    pairs, data = load_pairs(args)
    rows = training_rows(pairs, args.hard_negatives)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = SentenceTransformer(resolve_model_path(args.base), device=device)
    checkpoints = args.out / "checkpoints"
    resume = last_checkpoint(checkpoints)
    training_args = SentenceTransformerTrainingArguments(
        output_dir=str(checkpoints), num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr, warmup_steps=0.1, seed=args.seed, save_strategy="steps", save_steps=args.save_steps,
        save_total_limit=1, logging_steps=10, report_to=[], disable_tqdm=args.no_progress,
        batch_sampler=BatchSamplers.NO_DUPLICATES, use_cpu=device == "cpu")
    trainer = SentenceTransformerTrainer(model=model, args=training_args, train_dataset=Dataset.from_dict(rows),
                                         loss=MultipleNegativesRankingLoss(model), callbacks=callbacks)
    if resume:
        print(f"resuming from {resume}", file=sys.stderr)
    trainer.train(resume_from_checkpoint=resume)
    model.save(str(args.out))
    shutil.rmtree(checkpoints, ignore_errors=True)  # the model is written: nothing left to resume
    record = {"kind": "encoder", "base": args.base, "data": data, "examples": len(rows["anchor"]),
              "hard_negatives": sum(name.startswith("negative") for name in rows), "epochs": args.epochs,
              "batch_size": args.batch_size,
              "lr": args.lr, "seed": args.seed, "device": device, "seconds": round(time.time() - started, 1),
              "resumed_from": resume}
    (args.out / TRAINING_FILE).write_text(json.dumps(record, indent=1) + "\n")
    print(f"trained {args.base} on {data['pairs']} pairs of {data['queries']} queries from {data['source']} "
          f"(held out: {data['held_out']}, {data['held_out_queries_dropped']} of its queries dropped) in "
          f"{record['seconds']:.0f} s on {device} -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
