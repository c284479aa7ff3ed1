"""Every exercise's check (helpers.exercises) on a stand-in for the notebook's measurements: the placeholder is "not
attempted" and neither passes nor raises, the right answer passes, and every listed mistake raises with its own
hint. And the exercise cells show no answer: each ends with ``check("NN.k", name)`` and computes nothing itself."""
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from helpers import exercises
from helpers.exercises import NOT_ATTEMPTED, check
from helpers.models import SequenceClassifier

ROOT = Path(__file__).resolve().parent.parent


def _namespaces(tmp_path) -> dict:
    """Per exercise: ``(what the notebook measured, the right answer)``, numbers of the kind a run produces."""
    pcie = {1024: 3.0, 2**20: 11.5}
    return {
        "00.1": ({"n": 512, "measured": {"cpu": SimpleNamespace(median_s=0.004)}}, 32.0),
        "01.1": ({}, "label '10' was never seen in training; known classes: '1', '2', '3'"),
        "02.1": ({"matmul_results": {"cpu": {"fp32": {64: 10.0, 128: 45.0, 256: 80.0, 512: 90.0}}}}, 128),
        "03.1": ({"cuda": True, "bandwidth": {"H2D pinned": pcie}}, 256 * 3 * 32 * 32 * 4 / 11.5e9 * 1e6),
        "04.1": ({"dev": torch.device("cpu"), "train_images_per_s": {"cpu": 900.0},
                  "loader_images_per_s": {0: 400.0, 1: 950.0, 2: 1800.0}}, 1),
        "05.1": ({}, 0.8),
        "06.1": ({}, next(k for k in range(40) if (torch.tensor(1e-8) * 2**k).half().item() != 0)),
        "07.1": ({}, 0.01),
        "08.1": ({"compiled": {"fp32": {"eager_ms": 20.0, "compiled_ms": 15.0, "compile_seconds": 30.0,
                                        "break_even_steps": 6000.0}}}, 6000.0),
        "08.2": ({}, 0.125),
        "09.1": ({"exercise_phases": {"data wait": 1.2, "host to device": 0.4, "forward": 2.1, "backward": 3.9,
                                      "optimizer": 1.6}, "exercise_busy_ms": 2.3}, "overhead"),
        "09.2": ({"fixed_mb": 384.0, "per_image_mb": 2.5}, 6400),
        "10.1": ({"exercise_rates": {"real": 5900, "model": 14000, "input": 9000},
                  "exercise_phases": {"data wait": 6.0, "host to device": 0.5, "forward": 3.0, "backward": 6.0,
                                      "optimizer": 1.5},
                  "exercise_floors": {"shares": {"overhead": 0.05, "compute": 0.6, "memory": 0.2}, "intensity": 40,
                                      "ridge": 200},
                  "exercise_batch": {"speedup": 1.2, "low": 1.1, "high": 1.3}}, "input"),
        "11.1": ({"n_blocks": 85_000_000}, 6 * (85_000_000 + 50_257 * 768) + 12 * 12 * 1024 * 768),
        "11.2": ({"n_total": 124_475_904}, 16 * 124_475_904 / 2**30),
    }


SIMPLE = sorted(set(exercises.EXERCISES) - {"01.2", "05.2"})  # those two need a trained model or two runs' files


@pytest.mark.parametrize("key", SIMPLE)
def test_placeholder_right_answer_and_every_listed_mistake(key, tmp_path, capsys):
    ns, right = _namespaces(tmp_path)[key]
    for placeholder in [NOT_ATTEMPTED] + ([] if exercises.EXERCISES[key][1] else [None]):
        assert check(key, placeholder, namespace=ns) is False
        assert "Not attempted yet" in capsys.readouterr().out
    assert check(key, right, namespace=ns) is True
    answer = exercises.EXERCISES[key][0](ns)
    assert answer.wrong, f"{key} lists no mistake"
    for wrong, why in answer.wrong:
        with pytest.raises(AssertionError, match=re.escape(why)):
            check(key, wrong, namespace=ns)
    with pytest.raises(AssertionError, match=re.escape(answer.hint)):  # any other answer: the general hint
        check(key, "something else" if isinstance(right, str) else -12345, namespace=ns)


def test_none_is_an_answer_where_the_exercise_says_so(capsys):
    ns = {"dev": torch.device("cpu"), "train_images_per_s": {"cpu": 5000.0}, "loader_images_per_s": {0: 400.0}}
    assert check("04.1", None, namespace=ns) is True  # no worker count keeps up: None is right
    with pytest.raises(AssertionError, match="the first that keeps up"):
        check("04.1", 0, namespace=ns)


def test_a_check_with_nothing_to_check_says_why_and_neither_passes_nor_raises(capsys):
    ns = {"compiled": {"fp32": {"eager_ms": 20.0, "compiled_ms": 21.0, "compile_seconds": 30.0,
                                "break_even_steps": None}}}
    assert check("08.1", 123.0, namespace=ns) is False
    assert "never pays off" in capsys.readouterr().out


def test_the_lstm_exercise_wants_a_trained_unidirectional_model_and_its_own_accuracy():
    """Lesson 01's exercise 2 evaluates the learner's model again: a copied BiLSTM accuracy, a bidirectional model
    or an accuracy without a model do not pass."""
    def ns(bidirectional):
        model = None if bidirectional is None else SequenceClassifier(12, 9, bidirectional=bidirectional)
        return {"lstm": model, "test_loader": None, "dev": "cpu", "encoder": list(range(9)), "test_accuracy": 0.8,
                "evaluate": None}

    evaluated = {"accuracy": 0.75, "count": 370}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("helpers.exercises.evaluate", lambda *a, **k: evaluated)
        with pytest.raises(AssertionError, match="That is the BiLSTM's accuracy"):
            check("01.2", 0.8, namespace=ns(False))
        for bidirectional, answer in ((None, 0.75), (True, 0.75), (False, 0.5)):
            with pytest.raises(AssertionError, match="bidirectional=False"):
                check("01.2", answer, namespace=ns(bidirectional))
        assert check("01.2", 0.75, namespace=ns(False)) is True


def test_the_ddp_exercise_reads_the_two_runs_files_again(tmp_path):
    """Lesson 05's exercise 2: diff_small = 0 without the runs, or section 3's run saved again, does not pass."""
    diff = lambda a, b: max((a[k] - b[k]).abs().max().item() for k in a)  # noqa: E731
    ns = {"work": tmp_path, "max_param_diff": diff, "one_no_bn": {"w": torch.zeros(2)}}
    with pytest.raises(AssertionError, match="is not it"):
        check("05.2", 0, namespace=ns)  # no runs: no files
    for name in ("one16.pt", "two8.pt"):
        torch.save({"w": torch.ones(2)}, tmp_path / name)
    assert check("05.2", 0.0, namespace=ns) is True
    for name in ("one16.pt", "two8.pt"):  # section 3's run again: not the small runs
        torch.save({"w": torch.zeros(2)}, tmp_path / name)
    with pytest.raises(AssertionError, match="is not it"):
        check("05.2", 0.0, namespace=ns)


def _code_cells(path: Path) -> list:
    return ["".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
            if c["cell_type"] == "code"]


def test_every_exercise_is_checked_in_its_lesson_and_its_solution_and_its_cell_shows_no_answer():
    called = re.compile(r'check\("(\d\d\.\d)", (\w+)\)')
    found = {}
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for source in _code_cells(nb):
            for key, name in called.findall(source):
                found[key] = nb.stem
                assert key.startswith(nb.name[:2]), f"{nb.name} checks another lesson's exercise {key}"
                assert "expected" not in source and ".bound" not in source and "classify(" not in source, \
                    f"{nb.name}: exercise {key}'s cell computes its answer where the learner sees it"
                solution = (ROOT / "solutions" / f"{nb.stem}.py").read_text(encoding="utf-8")
                assert f'check("{key}", {name})' in solution, f"solutions/{nb.stem}.py does not end with the check"
    assert sorted(found) == sorted(exercises.EXERCISES), "an exercise in helpers.exercises that no lesson asks"


def test_a_prediction_is_compared_with_the_measurement_and_never_raises(capsys, monkeypatch):
    from helpers.exercises import check_prediction

    ns = {"matmul_results": {"cpu": {"fp32": {64: 10.0, 512: 80.0, 1024: 90.0}}}}
    assert check_prediction("02.p", None, namespace=ns) is None
    assert "No prediction written" in capsys.readouterr().out
    assert check_prediction("02.p", 100 / 27, namespace=ns) == pytest.approx(3.0)
    said = capsys.readouterr().out
    assert "You predicted 3.7037 %; this machine measured 11.1 %: 3 times your guess" in said
    assert "(n = 1024)" in said and "at n = 64 the fp32 product made 10 GFLOP/s, against 90" in said
    assert "quick mode" not in said
    assert check_prediction("02.p", 100 / 9 / 0.9, namespace=ns) == pytest.approx(0.9)
    assert "within 25 % of your guess" in capsys.readouterr().out
    assert check_prediction("02.p", 0, namespace=ns) == float("inf")  # a guess of 0 is far off, not a crash
    assert check_prediction("02.p", "ninety", namespace=ns) is None
    assert "A prediction is a number" in capsys.readouterr().out
    check_prediction("02.p", 90.0, namespace=dict(ns, lesson=SimpleNamespace(quick=True, budget_s=None)))
    assert "quick mode, smaller sizes, the largest size n = 1024" in capsys.readouterr().out
    steps = {"fp32": 40.0, "fp32 + channels_last": 38.0, "bf16": 200.0, "bf16 + channels_last": 210.0}
    cpu = {"step_ms": steps, "dev": torch.device("cpu"), "amp_speedup": 0.2}
    monkeypatch.setattr("helpers.exercises.cpu_bf16_native", lambda: False)
    assert check_prediction("06.p", 2.0, namespace=cpu) == pytest.approx(0.1)
    said = capsys.readouterr().out
    assert "1/10 of your guess" in said and "does not report bf16 instructions" in said and "bf16 200.0 ms" in said
    monkeypatch.setattr("helpers.exercises.cpu_bf16_native", lambda: True)
    check_prediction("06.p", 2.0, namespace=cpu)
    assert "depends on what bounds it" in capsys.readouterr().out
    assert check_prediction("06.p", 2.0, namespace=dict(cpu, amp_speedup=None)) is None
    assert "No half-precision step was measured" in capsys.readouterr().out


PREDICTED = {  # key: (a notebook's names, the measured value, words the reason must hold)
    "00.p": ({"n": 512, "measured": {"cpu": SimpleNamespace(median_s=0.004)}}, 4.0, "at 67 GFLOP/s"),
    "01.p": ({"step_s": {"cpu": {100: {8: 0.010, 64: 0.020}}}, "hidden": 100}, 2.0, "batch 8 to 64"),
    "03.p": ({"cuda": False, "bandwidth": {"host→host copy": {4096: 1.0, 2**26: 12.0}}}, 12.0, "64 MiB"),
    "04.p": ({"processes": 2, "parallel_sweep_speedup": 1.6}, 1.6, "2 processes"),
    "05.p": ({"speedup": {"1 process, no DDP": 1.0, "1": 0.98, "2": 0.7}, "worker_device": "cpu"}, 0.7,
             "share this machine's cores"),
    "08.p": ({"compiled": {"conv net depth 2, fp32": {"speedup": 1.4}}}, 1.4, "conv net depth 2"),
    "09.p": ({"ckpt": {"time_ratio": 1.3, "memory_ratio": 0.6}}, 1.3, "60% of the peak memory"),
    "10.p": ({"folder_result": SimpleNamespace(model_items_per_s=900.0, real_items_per_s=450.0,
                                               input_items_per_s=600.0)}, 2.0, "the loader alone made 600"),
    "11.p": ({"utilisation": {"mfu": 0.1, "flops_per_s": 1e10, "peak_flops_per_s": 1e11, "peak": "measured peak"}},
             10.0, "10 GFLOP/s"),
}


@pytest.mark.parametrize("key", sorted(PREDICTED))
def test_each_prediction_reads_its_measurement_and_says_why(key, capsys):
    from helpers.exercises import check_prediction

    ns, measured, words = PREDICTED[key]
    assert check_prediction(key, measured / 2, namespace=ns) == pytest.approx(2.0)
    said = capsys.readouterr().out
    assert "2 times your guess" in said and words in said, said
    assert check_prediction(key, None, namespace=ns) is None


def test_every_prediction_has_a_unit_test():
    assert sorted(PREDICTED) == sorted(k for k in exercises.PREDICTIONS if k not in ("02.p", "06.p"))


def test_a_prediction_left_out_of_the_run_says_so_and_passes_nothing(capsys):
    from helpers.exercises import check_prediction

    ns = {"compiled": {"conv net depth 2, fp32": {"error": "left out to fit the time budget"}}}
    assert check_prediction("08.p", 1.5, namespace=ns) is None
    assert "not compiled in this run (left out to fit the time budget)" in capsys.readouterr().out
    check_prediction("08.p", 1.5, namespace={"compiled": {"conv net depth 2, fp32": {"speedup": 0.83}}})
    assert "Below 1×, compiling made this step slower here" in capsys.readouterr().out


def test_the_bottleneck_exercise_says_why_each_wrong_answer_is_wrong():
    ns, right = _namespaces(None)["10.1"]
    with pytest.raises(AssertionError, match=r"copying \(0.5 ms\) is shorter than waiting \(6 ms\)"):
        check("10.1", "transfer", namespace=ns)
    with pytest.raises(AssertionError, match=r"the input alone \(9,000/s\) is slower than the model alone"):
        check("10.1", "compute", namespace=ns)
    with pytest.raises(AssertionError, match=r"copying \(0.5 ms\) is shorter"):  # as the verdicts print it
        check("10.1", " Transfer-bound", namespace=ns)
    for written in (f"{right.capitalize()}-bound", f"{right} bound.", f"'{right.upper()}'"):
        assert check("10.1", written, namespace=ns), written


def test_every_prediction_is_written_before_its_measurement_and_compared_after_it():
    for key, (_, measured_name) in exercises.PREDICTIONS.items():
        nb = next((ROOT / "notebooks").glob(f"{key[:2]}_*.ipynb"))
        cells = _code_cells(nb)
        compared = [i for i, s in enumerate(cells) if f'check_prediction("{key}", ' in s]
        assert len(compared) == 1, f"{nb.name} compares prediction {key} {len(compared)} times"
        guess = re.search(rf'check_prediction\("{re.escape(key)}", (\w+)\)', cells[compared[0]]).group(1)
        written = [i for i, s in enumerate(cells) if re.search(rf"^{guess} = None", s, re.M)]
        measured = [i for i, s in enumerate(cells) if re.search(rf"\b{measured_name} *=(?!=)", s)]
        assert written and measured, (key, written, measured)
        assert written[0] < measured[0] < compared[0], f"{nb.name}: write {key}'s guess, then measure, then compare"
