import pytest
import torch

from talariad.memory import KVLayout, PrefixAgreement, prefix_hashes, switch_all
from talariad.memory.torch_device import TorchDevice
from talariad.types import KVState, SwitchPath

from .conftest import (
    DEVICES,
    MHA,
    DeferredDevice,
    fill_pages,
    make_substrate,
    model_shapes,
    page_bytes,
    small_config,
    weights_match_host,
)

LAYOUTS = [
    pytest.param(MHA, id="mha-layer-first"),
    pytest.param(
        KVLayout(
            num_layers=3,
            num_kv_heads=2,
            head_dim=8,
            page_size=4,
            dtype="bfloat16",
            order="page_first",
        ),
        id="mha-page-first",
    ),
    pytest.param(
        KVLayout(num_layers=5, head_dim=16, page_size=4, dtype="float16", family="mla"), id="mla"
    ),
]


def two_models(layout=MHA, b_rows=512):
    return {"a": (model_shapes(512), layout), "b": (model_shapes(b_rows), layout)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_checkpoint_then_restore_after_switch_returns_the_saved_bytes(device, layout):
    sub = make_substrate(TorchDevice(device), models=two_models(layout))
    sub.switch_to("a", 0.0)
    hashes = prefix_hashes(list(range(4 * 5)), layout.page_size)
    pages = sub.allocate_pages("s", 5)
    fill_pages(sub, pages, seed=1)
    saved = page_bytes(sub, pages)
    assert sub.checkpoint("s", hashes, 1.0) == 5
    sub.poll(1.0)
    sub.switch_to("b", 2.0)
    assert sub.session_state("s", "a") is KVState.HOST
    sub.switch_to("a", 3.0)
    res = sub.restore("s", hashes, 4.0)
    sub.wait_restore("s")
    assert res.restored_pages == 5 and res.recompute_pages == 0 and res.restored_tokens == 20
    assert page_bytes(sub, res.pages) == saved
    assert sub.session_state("s") is KVState.DEVICE
    sub.check_integrity()


@pytest.mark.parametrize("device", DEVICES)
def test_switch_paths_full_d2d_partial_and_h2d_open_exact_bytes(device):
    sub = make_substrate(TorchDevice(device), models=two_models())
    sub.switch_to("a", 0.0)
    assert sub.stage("b", 0.0)
    sub.stage_step(0.0, max_chunks=100)
    sub.poll()
    full = sub.switch_to("b", 1.0)
    assert (
        full.path is SwitchPath.D2D
        and full.h2d_bytes == 0
        and full.staged_bytes == sub.models["b"].nbytes
    )
    assert weights_match_host(sub, "b")

    sub.stage("a", 1.0)
    sub.stage_step(1.0, max_chunks=100)
    sub.poll()
    n = sub.geometry.num_pages
    pages = sub.allocate_pages(
        "s", n - sub.staging.chunk_rows
    )  # overlaps every slot but the top one
    fill_pages(sub, pages, seed=5)
    part = sub.switch_to("a", 2.0)
    assert part.path is SwitchPath.PARTIAL and part.dirty_bytes > 0
    assert part.staged_bytes + part.h2d_bytes == sub.models["a"].nbytes
    assert weights_match_host(sub, "a")

    h2d = sub.switch_to("b", 3.0)
    assert h2d.path is SwitchPath.H2D and h2d.h2d_bytes == sub.models["b"].nbytes
    assert weights_match_host(sub, "b")
    assert [r.to_model for r in sub.records] == ["a", "b", "a", "b"]
    assert all(len(r.phase_s) == 5 and r.total_s >= 0 for r in sub.records)


def test_pointer_check_graphs_stay_valid_until_a_region_moves():
    sub = make_substrate(models=two_models(b_rows=256))
    sub.switch_to("a", 0.0)
    sub.mark_graphs_captured("a")
    sub.switch_to("b", 1.0)
    assert sub.records[-1].kv_shell_hit is False
    rec = sub.switch_to("a", 2.0)
    check = sub.pointer_check()
    assert rec.graphs_valid and rec.kv_shell_hit and check.graphs_valid
    assert (
        "kv_pool" in check.moved
    )  # b's smaller weights moved the pool; a's own graphs still match
    sub.switch_to("b", 3.0)
    sub.layout.resize_high("runtime", 128 << 10)
    assert sub.switch_to("a", 4.0).graphs_valid is False


def test_agreement_across_two_ranks_limits_what_either_restores():
    agree = PrefixAgreement(tp_size=2)
    ranks = [make_substrate(config=small_config(tp_rank=r), agreement=agree) for r in range(2)]
    for r in ranks:
        r.switch_to("a", 0.0)
        fill_pages(r, r.allocate_pages("s", 4), seed=r.config.tp_rank)
    hashes = prefix_hashes(list(range(16)), 4)
    ranks[0].checkpoint("s", hashes, 1.0)
    ranks[1].checkpoint("s", hashes[:2] + ["diverged", "tail"], 1.0)
    for r in ranks:
        r.free_session("s")
        r.poll()
    results = [r.restore("s", hashes, 2.0) for r in ranks]
    assert [(x.restored_pages, x.recompute_pages) for x in results] == [(2, 2), (2, 2)]


def test_switch_all_reports_one_record_per_rank():
    ranks = [make_substrate(config=small_config(tp_rank=r), models=two_models()) for r in range(2)]
    records = switch_all(ranks, "a", 0.0)
    assert [r.rank for r in records] == [0, 1]
    assert switch_all(ranks, "missing-model", 1.0) is None


def test_nothing_is_exposed_before_the_deferred_copy_runs():
    dev = DeferredDevice()
    sub = make_substrate(dev, models=two_models())
    sub.switch_to("a", 0.0)
    pages = sub.allocate_pages("s", 3)
    fill_pages(sub, pages, seed=3)
    saved = page_bytes(sub, pages)
    hashes = prefix_hashes(list(range(12)), 4)
    sub.checkpoint("s", hashes, 1.0)
    sub.free_session("s")
    assert sub.session_state("s", "a") is KVState.MISSING
    fill_pages(sub, sub.allocate_pages("t", 3), seed=9)  # must not reuse the pages being saved
    sub.poll()
    assert sub.session_state("s", "a") is KVState.MISSING
    dev.synchronize()
    sub.poll()
    assert sub.session_state("s", "a") is KVState.HOST
    sub.free_session("t")
    res = sub.restore("s", hashes, 2.0)
    sub.wait_restore("s")
    assert page_bytes(sub, res.pages) == saved
    sub.check_integrity()


def test_switch_drains_only_the_outgoing_models_saves():
    dev = DeferredDevice()
    sub = make_substrate(dev, models=two_models())
    sub.switch_to("a", 0.0)
    fill_pages(sub, sub.allocate_pages("s", 2), seed=1)
    sub.checkpoint("s", prefix_hashes(list(range(8)), 4), 1.0)
    rec = sub.switch_to("b", 2.0)
    assert rec.drained_saves == 2 and sub.session_state("s", "a") is KVState.HOST


def test_post_processed_weights_become_the_layout_that_is_reloaded():
    sub = make_substrate(models=two_models())
    sub.switch_to("a", 0.0)
    w = sub.weights_view("a")
    processed = {
        "packed": torch.cat([w["embed"].flatten(), w["head"].flatten()]).to(torch.float16) * 2
    }
    views = sub.finalize_weights(
        "a", {"packed": (tuple(processed["packed"].shape), "float16")}, processed
    )
    raw = processed["packed"].view(torch.uint8)
    assert list(views) == ["packed"] and torch.equal(views["packed"].view(torch.uint8), raw)
    sub.switch_to("b", 1.0)
    sub.switch_to("a", 2.0)
    assert torch.equal(sub.weights_view("a")["packed"].view(torch.uint8), raw)
    assert sub.models["a"].processed


def test_mamba_state_round_trips_through_the_registry():
    lay = KVLayout(num_layers=3, family="mamba", state_bytes=96, dtype="float32")
    sub = make_substrate(models={"m": (model_shapes(64), lay), "b": (model_shapes(64), MHA)})
    sub.switch_to("m", 0.0)
    pages = sub.allocate_pages("s", 1)
    fill_pages(sub, pages, seed=2)
    saved = page_bytes(sub, pages)
    hashes = prefix_hashes(list(range(3)), 1)
    assert sub.checkpoint("s", hashes, 1.0) == 1
    sub.switch_to("b", 2.0)
    sub.switch_to("m", 3.0)
    res = sub.restore("s", hashes, 4.0)
    sub.wait_restore("s")
    assert res.restored_pages == 3 and len(res.pages) == 1 and page_bytes(sub, res.pages) == saved


def test_layout_report_lists_regions_and_staged_chunks():
    sub = make_substrate(models=two_models())
    sub.switch_to("a", 0.0)
    sub.stage("b", 0.0)
    sub.stage_step(0.0, 2)
    rows = sub.layout_report()
    names = [r[0] for r in rows]
    assert names[:2] == ["weights", "kv_pool"] and names[-2:] == ["graph_pool", "runtime"]
    assert sum(1 for n in names if n.startswith("staged[")) == 2
    assert all(owner.startswith("b:") for n, _, _, owner in rows if n.startswith("staged["))
    assert sub.staging_slack() > 0
    sub.check_integrity()


def test_cannot_answers_are_none():
    sub = make_substrate()
    assert sub.allocate_pages("s", 1) is None and sub.weights_view("a") is None
    assert sub.switch_to("nope", 0.0) is None
    sub.switch_to("a", 0.0)
    assert sub.switch_to("a", 1.0) is None
    assert sub.allocate_pages("s", 10**6) is None
    assert sub.restore("s", ["x"], 1.0) is None
    with pytest.raises(ValueError, match="already registered"):
        sub.register_model("a", model_shapes(8), MHA)
