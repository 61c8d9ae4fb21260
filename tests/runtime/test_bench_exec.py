"""``bench exec``'s measurement: process memory through /proc, the suites, one real measuring
process on a tiny model, and what a failed or stuck process reports."""

from __future__ import annotations

import gc
import importlib.util
import sys

import pytest

from tensorarena.bench import process_memory
from tensorarena.bench.exec_configs import SUITES, Config, suite
from tensorarena.bench.exec_subprocess import (
    RunOptions,
    _median_of,
    make_job,
    ratios,
    run_job,
)

HAVE_MODELS = all(importlib.util.find_spec(name) for name in ("torch", "transformers"))
needs_models = pytest.mark.skipif(not HAVE_MODELS, reason="needs torch and transformers")
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@linux
def test_the_peak_resets_and_then_counts_what_a_call_held() -> None:
    assert process_memory.reset_peak()
    before = process_memory.rss()
    block = bytearray(64 << 20)  # zero-filled: every page touched
    del block
    gc.collect()
    peak, after = process_memory.peak_rss(), process_memory.rss()
    assert before is not None and peak is not None and after is not None
    assert peak - before >= 60 << 20  # the block was resident while it lived
    assert after - before < 16 << 20  # and went back when freed (glibc: mmap'd)
    assert process_memory.reset_peak()
    assert process_memory.peak_rss() - process_memory.rss() <= 1 << 20  # type: ignore[operator]


def test_the_base_suite_is_real_sizes_at_real_shapes() -> None:
    labels = [config.label for config in SUITES["base"]]
    assert labels[:3] == ["gpt2-1x128", "gpt2-2x512", "bert-2x256"]
    assert {"resnet-2", "vit-2", "whisper-tiny-encoder-1", "gpt2-train-2x128",
            "bert-train-2x128"} <= set(labels)
    assert [c.label for c in suite("base", models=["bert"], mode="training")] == [
        "bert-train-2x128"]
    # An architecture the suite lacks is measured at its default shape, both ways.
    assert suite("tiny", models=["convnext"]) == [Config("convnext"),
                                                  Config("convnext", training=True)]


def test_ratios_compare_with_eager_and_leave_out_what_is_missing() -> None:
    got = ratios({"eager": {"live_peak": 100, "rss_peak": 0, "ms": 2.0},
                  "planned": {"live_peak": 80, "rss_peak": 5, "ms": 3.0}})
    assert got == {"planned/eager": {"live_peak": 0.8, "rss_peak": None, "rss_held": None,
                                     "rss_held_dropped": None, "rss_held_released": None,
                                     "rss_after_delete": None, "ms": 1.5}}


def test_several_processes_keep_the_median_of_each_resident_number() -> None:
    runs = [{"memory": {"live_peak": 7, "rss_built": b, "rss_peak": p, "rss_held": p,
                        "rss_held_dropped": None}, "library_rss": 3}
            for b, p in ((10, 40), (30, 20), (20, 90))]
    got = _median_of(runs)
    assert (got["rss_built"], got["rss_peak"], got["rss_held"]) == (20, 40, 40)
    assert got["rss_held_dropped"] is None and got["live_peak"] == 7 and got["library_rss"] == 3
    assert got["rss_runs"]["rss_peak"] == [40, 20, 90]
    assert "rss_runs" not in _median_of(runs[:1])  # one process: its numbers as they are


@needs_models
@pytest.mark.torch
def test_a_fresh_process_measures_a_planned_tiny_model_and_times_it_against_eager() -> None:
    run = RunOptions(executions=("eager", "planned"), repeats=2, calls=1, timeout=600)
    job = make_job(Config("gpt2"), run, memory="planned", latency=("eager", "planned"),
                   verify=True)
    result = run_job(job, timeout=run.timeout)
    assert "error" not in result and result["torch_threads"] == 1
    memory, details = result["memory"], result["details"]
    assert "error" not in memory
    assert memory["arena_bytes"] == details["planned_arena"] > 0
    assert memory["live_peak"] == memory["torch_peak"] + memory["arena_bytes"]
    # the logits, planned into the tail handed over (outputs="handover", the default): torch
    # allocates nothing for them
    assert memory["output_bytes"] > 0 and memory["torch_peak"] < memory["output_bytes"]
    assert details["tail_bytes"] >= memory["output_bytes"]
    # /proc worked in the child: the peak holds at least what stays held after the call, and
    # dropping the outputs gives back at least what came in since (a page either way is noise).
    assert memory["rss_peak"] >= max(memory["rss_held"], memory["rss_held_dropped"]) > 0
    assert memory["rss_held_dropped"] <= memory["rss_held"] + (64 << 10)
    # empty_cache() between calls gives the idle arena's pages back, the program kept
    assert memory["rss_held_released"] <= memory["rss_held_dropped"] + (64 << 10)
    assert memory["rss_held"] >= memory["rss_built"] - (1 << 20)
    assert result["library_rss"] > 0  # export's imports, charged to no model
    assert details["lower_bound"] <= details["planned_arena"] <= details["naive"]
    assert details["verified"]
    latency = result["latency"]
    assert latency["max_abs_err"] == {"planned": 0.0} and latency["skipped"] == {}
    assert set(latency["ms"]) == {"eager", "planned"} and min(latency["ms"].values()) > 0


@needs_models
@pytest.mark.torch
def test_the_exported_module_is_measured_like_eager_and_what_it_leaves_once_deleted() -> None:
    run = RunOptions(executions=("eager", "exported"), calls=1, timeout=600)
    result = run_job(make_job(Config("gpt2"), run, memory="exported"), timeout=run.timeout)
    memory = result["memory"]
    assert "error" not in memory and memory["arena_bytes"] == 0 and memory["torch_peak"] > 0
    # measured once the module is deleted (export's residue stays: it is not compared here,
    # the profiled call after the peak takes memory of its own)
    assert isinstance(memory["rss_after_delete"], int) and memory["rss_peak"] > 0


def test_a_training_configuration_skips_the_exported_module_without_a_process() -> None:
    from tensorarena.bench.exec_subprocess import Progress, measure_config

    run = RunOptions(executions=("exported",), timeout=600)
    result = measure_config(Config("gpt2", training=True), run, Progress(None))
    assert result["skipped"] == {"exported": "inference only"} and result["executions"] == {}


@needs_models
@pytest.mark.torch
def test_a_process_past_its_timeout_or_failing_is_an_error_not_an_exception() -> None:
    run = RunOptions(executions=("eager",), timeout=600)
    job = make_job(Config("bert"), run, memory="eager")
    assert run_job(job, timeout=0.5) == {"error": "ran past the timeout of 0.5 s"}
    job["config"]["model"] = "gpt3"
    error = run_job(job, timeout=600)["error"]
    assert error.startswith("the process exited with status 1: ")
    assert "UnknownNameError: unknown architecture 'gpt3'" in error
