"""TrainConfig and load_train_config: defaults, TOML, overrides, and one-line errors."""

from pathlib import Path
from typing import Any

import pytest
import torch

from autockpt import Budget
from autockpt.errors import BudgetError, ConfigError
from autockpt.training.options import config as config_module
from autockpt.training.options import settings as settings_module
from autockpt.training.options.config import TrainConfig, load_train_config
from autockpt.training.options.settings import column_roles, resolve_budget


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_leave_preset_values_unset() -> None:
    config = TrainConfig()
    assert config.batch_size is None
    assert config.use_gradient_checkpointing is None
    assert config.vram_budget is None


def test_toml_values_and_command_line_overrides(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        'preset = "tiny"\nepochs = 3\nvram_budget = "2GB"\nknown_columns = ["a", "b"]\n'
        'static_columns = ["exchange"]\nignore_columns = ["raw"]\nscaling = "global"\n',
    )
    config = load_train_config(path, {"epochs": 5, "lr": None})
    assert config.preset == "tiny"
    assert config.epochs == 5  # the command line wins
    assert config.lr == TrainConfig().lr  # None leaves the default alone
    assert config.known_columns == ("a", "b")
    assert isinstance(config.vram_budget, Budget) and config.vram_budget.bytes == 2 * 10**9
    roles = column_roles(config)
    assert (roles.known, roles.static, roles.ignore) == (["a", "b"], ["exchange"], ["raw"])
    assert roles.scaling == "global" and roles.observed is None


def test_base_values_sit_under_the_file(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "epochs = 4\n")
    config = load_train_config(path, {}, base={"preset": "tiny", "epochs": 1})
    assert (config.preset, config.epochs) == ("tiny", 4)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("epochs = \n", "not valid TOML"),
        ("epoch = 3\n", "unknown key 'epoch'; did you mean 'epochs'?"),
        ("[train]\nepochs = 3\n", "unknown key 'train'"),
        ("epochs = 0\n", "epochs = 0 is invalid: must be at least 1"),
        ('preset = "huge"\n', "is not a preset (preset: model size, one of tiny, small, tft-225"),
        ('device = "tpu"\n', "device = 'tpu' is invalid"),
        ('vram_budget = "4XB"\n', "budget '4XB' is not a size"),
        ("lr = -1.0\n", "must be a finite number above 0"),
    ],
)
def test_bad_toml_raises_one_line_config_error(tmp_path: Path, text: str, fragment: str) -> None:
    path = write_toml(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_train_config(path, {})
    message = str(caught.value)
    assert fragment in message
    assert "\n" not in message.strip()


def test_missing_toml_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist; check the path after --config"):
        load_train_config(tmp_path / "nope.toml", {})


def test_errors_name_the_option_they_came_from() -> None:
    with pytest.raises(ConfigError, match=r"^--max-steps-per-epoch = 0 is invalid"):
        load_train_config(None, {"max_steps_per_epoch": 0})


@pytest.mark.parametrize("text", ["4XB", "-1GB", "0", "", "   "])
def test_bad_budget_strings_fail_at_load(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_train_config(None, {"vram_budget": text})
    assert isinstance(caught.value, ConfigError)
    assert "budget" in str(caught.value)


def test_budget_errors_keep_the_units_message() -> None:
    with pytest.raises(ConfigError, match="write a positive size like 4GB"):
        load_train_config(None, {"vram_budget": "-1GB"})
    assert issubclass(BudgetError, ValueError)


def test_auto_budget_is_read_later_with_the_device() -> None:
    assert load_train_config(None, {"vram_budget": "auto"}).vram_budget == "auto"


def test_the_budget_is_read_once_and_saved_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [One budget]: the config reads the flag; copies, the run's settings and the saved
    config carry what it read, and the saved text reads back to the same budget."""
    config = load_train_config(None, {"vram_budget": "3.5GiB"})
    read = config.vram_budget
    assert isinstance(read, Budget) and read.bytes == int(3.5 * 2**30)

    readings: list[object] = []
    reading = config_module.parse_budget

    def counted(value: Any, **kwargs: Any) -> Budget:
        readings.append(value)
        return reading(value, **kwargs)

    monkeypatch.setattr(config_module, "parse_budget", counted)
    monkeypatch.setattr(settings_module, "parse_budget", counted)
    copy = config.with_updates(epochs=2)
    assert copy.vram_budget is read
    assert resolve_budget(copy.vram_budget, torch.device("cpu")) is read
    saved = copy.model_dump(mode="json")
    assert saved["vram_budget"] == "3.5GiB"
    assert "3.5GiB" not in readings, "the budget was read again"
    monkeypatch.undo()
    assert TrainConfig.model_validate(saved).vram_budget == read


def test_with_updates_validates() -> None:
    config = TrainConfig(preset="tiny")
    assert config.with_updates(epochs=2).epochs == 2
    with pytest.raises(ConfigError, match="epochs = 0"):
        config.with_updates(epochs=0)


def test_every_field_is_documented() -> None:
    for name, field in TrainConfig.model_fields.items():
        assert field.description, f"{name} has no docstring"


def test_the_split_is_shares_or_two_dates_quoted_or_not(tmp_path: Path) -> None:
    dates = load_train_config(
        write_toml(tmp_path, "split = [2024-03-01, 2024-03-15T09:30:00]\n"), {}
    )
    assert dates.split == ("2024-03-01", "2024-03-15T09:30:00")  # TOML dates read as text
    quoted = load_train_config(write_toml(tmp_path, 'split = ["2024-03-01", "2024-03-15"]\n'), {})
    assert quoted.split == ("2024-03-01", "2024-03-15")
    assert TrainConfig(split=("0.8", "0.1", "0.1")).split == (0.8, 0.1, 0.1)  # type: ignore[arg-type]
    for bad, words in [
        (("0.8", "0.2"), "three shares"),  # two shares, not two dates
        (("2024-03-15", "2024-03-01"), "test must begin after validation"),
        (("March", "April"), "'March' is not an ISO 8601 date"),
    ]:
        with pytest.raises(ConfigError, match=words):
            load_train_config(None, {"split": bad})
