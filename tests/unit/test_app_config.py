import pytest
from pydantic import ValidationError

from deployments.config import (
    AppConfig,
    CollectionConfig,
    RerankerConfig,
    RouterSettings,
    app_args_from_yaml,
    app_policy_from_yaml,
)
from deployments.edge.schemas import SearchRequest


def test_index_shorthand_is_the_default_collection():
    cfg = AppConfig(index="indexes/demo")
    assert list(cfg.resolved_collections()) == ["default"]


@pytest.mark.parametrize(
    "args, message",
    [
        ({}, "no index to serve"),
        ({"index": "a", "collections": {"x": {"index": "b"}}}, "not both"),
        ({"collections": {"x": {"index": "b"}}, "default_collection": "y"}, "'y' is not one of ['x']"),
        ({"index": "a", "shards": {"num_replicas": 0}}, "greater than or equal to 1"),
        ({"index": "a", "shards": {"placement": "anywhere"}}, "Input should be 'auto', 'router' or 'deployment'"),
        ({"index": "a", "encoder": {"backend": "tflite"}}, "Input should be 'onnx', 'onnx-int8' or 'torch'"),
        ({"index": "a", "router": {"fusion": "borda"}}, "Input should be 'rrf' or 'weighted'"),
        ({"index": "a", "typo": 1}, "Extra inputs are not permitted"),
        ({"index": "a", "reranker": {"autoscaling": {"min_replicas": 3, "max_replicas": 2}}}, "min_replicas 3 >"),
        ({"index": "a", "reranker": {"dtype": "int4"}}, "Input should be 'auto', 'float32', 'float16' or 'bfloat16'"),
        ({"index": "a", "synthesis": {"engine": "llama"}}, "Input should be 'auto', 'extractive', 'transformers' or"),
        ({"index": "a", "router": {"rerank_timeout_s": 0}}, "greater than 0"),
    ],
)
def test_bad_app_configs_fail_before_anything_starts(args, message):
    with pytest.raises(ValidationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        AppConfig.model_validate(args)


def test_collections_keep_their_versions():
    cfg = AppConfig(collections={"a": CollectionConfig(index="x", version="v1")}, default_collection="a")
    assert cfg.resolved_collections()["a"].version == "v1"
    assert RouterSettings().rrf_k == 60 and RouterSettings().dense_weight == 0.5


@pytest.mark.parametrize(
    "body, field",
    [
        ({"query": ""}, "query"),
        ({"query": " \t\n"}, "query"),
        ({"query": "x" * 100_001}, "query"),  # past what any service takes (router.max_query_chars: its own)
        ({"query": "x", "limit": 0}, "limit"),
        ({"query": "x", "limit": 101}, "limit"),
        ({"query": "x", "weights": {"dense": 0, "keyword": 0}}, "weights"),
        ({"query": "x", "weights": {"dense": 1.5}}, "weights"),
        ({"query": "x", "mmr_lambda": 2}, "mmr_lambda"),
        ({"query": "x", "collections": ["a", "a"]}, "collections"),
        ({"query": "x", "collections": []}, "collections"),
        ({"query": "x", "unknown": 1}, "unknown"),
        ({"query": "x", "rerank_depth": 201}, "rerank_depth"),
        ({"query": "x", "rerank_with": "coin"}, "rerank_with"),
        ({"query": "x", "max_answer_tokens": 0}, "max_answer_tokens"),
    ],
)
def test_request_limits(body, field):
    with pytest.raises(ValidationError) as e:
        SearchRequest(**body)
    assert e.value.errors()[0]["loc"][0] == field


def test_request_defaults():
    r = SearchRequest(query="  hello  ")
    assert (r.method.value, r.limit, r.fusion, r.mmr_lambda, r.include_citations) == ("hybrid", 10, None, None, True)


def test_serve_config_yaml_is_a_valid_app_config():
    from pathlib import Path

    cfg = AppConfig.model_validate(app_args_from_yaml(Path(__file__).parents[2] / "serve_config.yaml"))
    assert cfg.synthesis.enabled and cfg.reranker.model is None  # the demo: answers on, no reranker to deploy
    assert cfg.reranker.autoscaling.max_replicas >= cfg.reranker.autoscaling.min_replicas


def test_a_yaml_file_of_args_alone_is_read_as_it_is_and_a_serve_config_must_hold_this_app_once(tmp_path):
    args = tmp_path / "args.yaml"
    args.write_text("index: a\nshards: {num_replicas: 2}\n")
    assert app_args_from_yaml(args) == {"index": "a", "shards": {"num_replicas": 2}}
    other = tmp_path / "other.yaml"
    other.write_text("applications: [{name: x, import_path: elsewhere:app, args: {index: a}}]\n")
    with pytest.raises(ValueError, match="0 applications of deployments.serve.app:build_app"):
        app_args_from_yaml(other)
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text("applications: [{import_path: 'deployments.serve.app:build_app', args: {index: a},\n"
                         "                deployments: [{name: router, user_config: {rrf_k: 10}}]}]\n")
    with pytest.raises(ValueError, match="per-deployment overrides"):
        app_args_from_yaml(overrides)


def test_the_application_level_autoscaling_policy_of_a_serve_config_is_carried_and_an_args_file_has_none(tmp_path):
    serve_config = tmp_path / "serve.yaml"
    serve_config.write_text("applications: [{import_path: 'deployments.serve.app:build_app', args: {index: a},\n"
                            "  autoscaling_policy: {policy_function: 'deployments.serve.autoscale:groups_together'}}]\n")
    assert app_args_from_yaml(serve_config) == {"index": "a"}
    assert app_policy_from_yaml(serve_config) == {"policy_function": "deployments.serve.autoscale:groups_together"}
    args = tmp_path / "args.yaml"
    args.write_text("index: a\n")
    assert app_policy_from_yaml(args) is None


def test_the_index_shorthand_takes_a_version():
    assert AppConfig(index="a", version="v1").resolved_collections()["default"].version == "v1"
    assert AppConfig(index="a").resolved_collections()["default"].version is None
    with pytest.raises(ValidationError, match="'version' goes with 'index'"):
        AppConfig(collections={"x": {"index": "b"}}, default_collection="x", version="v1")


def test_stages_of_a_request_default_off():
    r = SearchRequest(query="x")
    assert (r.rerank, r.rerank_depth, r.rerank_with.value, r.synthesize, r.stream) == (
        None, None, "cross_encoder", False, False)
    with pytest.raises(ValidationError, match="set synthesize: true"):
        SearchRequest(query="x", stream=True)


def test_offline_model_names_are_checked_before_start(monkeypatch, tmp_path):
    from deployments.serve.app import check_model_available

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    check_model_available(str(tmp_path), "reranker.model")  # a folder is fine
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE=1 forbids downloading"):
        check_model_available("someone/no-such-reranker", "reranker.model")


def test_cpus_needed_to_start_counts_every_replica(tmp_path):
    from deployments.serve.app import logical_cpus_needed
    from index_format.versions import activate
    from tests.unit.test_activation import _publish

    _publish(tmp_path, "v1", shards=4)
    activate(tmp_path, "v1")
    cfg = AppConfig(index=tmp_path, shards={"num_replicas": 2, "num_cpus": 0.25, "group_size": 1},
                    encoder={"num_cpus": 0.5, "placement": "deployment"}, router={"num_cpus": 0.25})
    assert logical_cpus_needed(cfg) == pytest.approx(4 * 2 * 0.25 + 0.5 + 0.25)
    # The defaults: one group of all 4 shards (2 replicas of it), queries embedded in the router.
    grouped = AppConfig(index=tmp_path, shards={"num_replicas": 2, "num_cpus": 0.25}, router={"num_cpus": 0.25})
    assert logical_cpus_needed(grouped) == pytest.approx(2 * 0.25 + 0.25)
    pairs = grouped.model_copy(update={"shards": grouped.shards.model_copy(update={"group_size": 3})})  # 3 and 1
    assert logical_cpus_needed(pairs) == pytest.approx(2 * 2 * 0.25 + 0.25)
    rerank = cfg.model_copy(update={"reranker": RerankerConfig(model="m", num_cpus=0.5,
                                                               autoscaling={"min_replicas": 2, "max_replicas": 4})})
    assert logical_cpus_needed(rerank) == pytest.approx(2.75 + 2 * 0.5)
    # One shard replica: the shards are searched inside the router and reserve nothing of their own.
    alone = AppConfig(index=tmp_path, router={"num_cpus": 0.25})
    assert alone.shards.in_router and logical_cpus_needed(alone) == pytest.approx(0.25)


def test_shard_placement_auto_keeps_shards_apart_only_when_asked_to_scale_or_place_them(tmp_path):
    assert AppConfig(index=tmp_path).shards.in_router
    for apart in ({"num_replicas": 2}, {"group_size": 2}, {"num_gpus": 0.5}, {"resources": {"search_node": 1}},
                  {"placement": "deployment"}):
        assert not AppConfig(index=tmp_path, shards=apart).shards.in_router, apart
    assert AppConfig(index=tmp_path, shards={"num_replicas": 2, "placement": "router"}).shards.in_router


def test_encoder_placement_auto_embeds_in_the_router_unless_on_a_gpu(tmp_path):
    assert AppConfig(index=tmp_path).encoder.in_router
    assert not AppConfig(index=tmp_path, encoder={"num_gpus": 1}).encoder.in_router
    assert not AppConfig(index=tmp_path, encoder={"placement": "deployment"}).encoder.in_router


def test_only_the_routers_request_settings_reach_its_user_config():
    router = AppConfig(index="a", router={"num_replicas": 2, "fusion": "rrf"}).router
    assert router.settings() == RouterSettings(fusion="rrf")
    assert set(router.settings().model_dump()) == set(RouterSettings.model_fields)
