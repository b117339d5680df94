"""The dataset card's YAML front matter is valid and agrees with the builder's features."""

from pathlib import Path

import yaml

from chexpercept.vocab import LESIONS, PATHS
from chexpercept_dataset import Chexpercept

CARD = Path(__file__).resolve().parents[1] / "dataset_card.md"


def _front_matter() -> dict:
    text = CARD.read_text()
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n", 2)[1])


def _names(features: list[dict]) -> list[str]:
    return [f["name"] for f in features]


def test_card_configs_match_builder():
    meta = _front_matter()
    assert meta["gated"] is True and meta["license"] == "other"
    assert {c["config_name"] for c in meta["configs"]} == {"sequences", "items"}
    by_config = {info["config_name"]: info for info in meta["dataset_info"]}
    for name in ("sequences", "items"):
        builder_features = Chexpercept(config_name=name).info.features
        card = by_config[name]["features"]
        assert _names(card) == list(builder_features), name
        lesion = next(f for f in card if f["name"] == "lesion")
        assert list(lesion["dtype"]["class_label"]["names"].values()) == list(LESIONS)
        path = next(f for f in card if f["name"] == "path")
        assert list(path["dtype"]["class_label"]["names"].values()) == [p.value for p in PATHS]
    turns = next(f for f in by_config["sequences"]["features"] if f["name"] == "turns")
    assert _names(turns["list"]) == list(Chexpercept(config_name="sequences").info.features["turns"].feature)
    assert by_config["items"]["splits"][0]["num_examples"] == 10_400


def test_card_has_required_sections():
    text = CARD.read_text()
    for heading in (
        "## Dataset structure",
        "## Statistics",
        "## Access and data-use obligations",
        "## Intended use and limitations",
        "## Citation",
    ):
        assert heading in text
    assert "never use them to compare models" in text
