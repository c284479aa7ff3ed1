"""Never an empty GPU section: every notebook that needs a GPU shows, on a CPU, a labelled prediction for at least
two datasheet GPUs beside any "no reference committed" line; its results hold ``predicted``, and its training runs
``mfu``. Reads the notebooks nbval executed in this run (build/test-executed/), so it runs after them; alone, it
runs the six notebooks itself (tools/run_course.py, quick, CPU)."""
import json
import re
from pathlib import Path

import nbformat
import pytest
from conftest import executed_notebooks

ROOT = Path(__file__).resolve().parent.parent
PREDICTING = ("01", "02", "03", "05", "06", "08")  # the lessons whose main question needs a GPU
TRAINING = ("01", "05", "06")                      # ... and those of them that train a model
LABEL = "predicted from the datasheet, not measured"
NO_REFERENCE = re.compile(r"no (?:gpu |cuda )?reference result[^.]*committed", re.IGNORECASE)

pytestmark = pytest.mark.executed


def _sources():
    return sorted(nb for nb in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb") if nb.name[:2] in PREDICTING)


@pytest.fixture(scope="module")
def executed():
    """``{prefix: (executed notebook, results record)}`` from this run (or of the six, run here when alone)."""
    folder, results = executed_notebooks(PREDICTING)
    return {nb.name[:2]: (nbformat.read(folder / nb.name, as_version=4),
                          json.loads((results / f"{nb.stem}.json").read_text())["results"]) for nb in _sources()}


def cell_texts(nb) -> list[str]:
    """What a reader sees of each code cell's output: printed text, Markdown and plain-text values."""
    texts = []
    for cell in nb.cells:
        parts = []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out.get("text", ""))
            for kind in ("text/markdown", "text/plain"):
                parts.append(out.get("data", {}).get(kind, ""))
        texts.append("".join(parts))
    return texts


def unanswered(nb) -> list[str]:
    """Outputs that say no reference is committed and show no prediction beside it (in the same cell)."""
    return [t[:200] for t in cell_texts(nb) if NO_REFERENCE.search(t) and "predicted" not in t.lower()]


def gpus_predicted(predicted: dict) -> list[str]:
    """The GPUs a results record holds a prediction for (a name with at least one number inside)."""
    def has_number(node):
        if isinstance(node, dict):
            return any(has_number(v) for v in node.values())
        return isinstance(node, (int, float)) and not isinstance(node, bool)
    return [gpu for gpu, entry in predicted.items() if has_number(entry)]


def test_the_check_finds_a_section_left_empty():
    nb = nbformat.v4.new_notebook()
    empty = nbformat.v4.new_code_cell("")
    empty.outputs = [nbformat.v4.new_output("stream", name="stdout", text="No GPU reference result is committed yet.")]
    answered = nbformat.v4.new_code_cell("")
    answered.outputs = [nbformat.v4.new_output("display_data", data={
        "text/markdown": f"No reference result from a GPU is committed yet; T4: 1.2 ms ({LABEL})."})]
    nb.cells = [empty, answered]
    assert len(unanswered(nb)) == 1
    assert gpus_predicted({"T4": {"step_ms": {"8": 1.0}}, "H200 SXM": {"skipped": "no fp32 row"}}) == ["T4"]


@pytest.mark.parametrize("prefix", PREDICTING)
def test_every_gpu_section_shows_a_labelled_prediction(executed, prefix):
    nb, _ = executed[prefix]
    assert unanswered(nb) == [], f"{prefix}: 'no reference committed' without a prediction beside it"
    labelled = [t for t in cell_texts(nb) if LABEL in t]
    assert labelled, f"{prefix}: no output carries the label '{LABEL}'"


@pytest.mark.parametrize("prefix", PREDICTING)
def test_results_hold_predictions_for_two_gpus(executed, prefix):
    _, results = executed[prefix]
    assert len(gpus_predicted(results.get("predicted", {}))) >= 2, results.get("predicted")


@pytest.mark.parametrize("prefix", TRAINING)
def test_training_runs_record_mfu(executed, prefix):
    _, results = executed[prefix]
    mfu = results.get("mfu")
    values = list(mfu.values()) if isinstance(mfu, dict) else [mfu]
    assert values and all(isinstance(v, float) and 0 < v < 1 for v in values), mfu


def test_quick_results_keep_the_keys_they_had_before_the_house_moves():
    """Every key each notebook's quick results had on a CPU before issue 37 moved code (tests/quick_results_keys.json)
    is still there: a refactor of ``helpers`` keeps what every lesson records."""
    before = json.loads((ROOT / "tests" / "quick_results_keys.json").read_text())["keys"]
    results, lost = executed_notebooks()[1], {}
    for stem, keys in before.items():
        missing = set(keys) - set(json.loads((results / f"{stem}.json").read_text())["results"])
        if missing:
            lost[stem] = sorted(missing)
    assert lost == {}, f"quick results lost keys: {lost}"
