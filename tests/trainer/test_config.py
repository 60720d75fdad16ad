"""Config: YAML plus `--field value` overrides, repeated service URLs, and checks that name the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.trainer.config import ConfigError, TrainConfig, build_parser, config_from_dict, load_config

REPO = Path(__file__).resolve().parents[2]


def test_yaml_then_overrides_and_repeated_urls(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("problems_per_step: 2\nlearning_rate: 5e-5\nuse_lora: true\n")
    config, args = load_config(
        [
            "--config",
            str(path),
            "--num-trajectories",
            "8",
            "--use_lora",
            "false",
            "--evaluator-url",
            "http://a",
            "--evaluator-url",
            "http://b",
            "--implementer-url",
            "http://c",
            "--epsilon-high",
            "0.28",
            "--resume",
        ]
    )
    assert (config.problems_per_step, config.num_trajectories, config.use_lora) == (2, 8, False)
    assert config.learning_rate == pytest.approx(5e-5)  # YAML reads 5e-5 as a string; it is converted
    assert config.evaluator_urls == ["http://a", "http://b"]
    assert config.implementer_urls == ["http://c"]
    assert config.epsilon_high == pytest.approx(0.28)
    assert args.resume


def test_shipped_configs_load():
    for name in ("default.yaml", "qwen2-gpt4o.yaml"):
        config, _ = load_config(["--config", str(REPO / "configs" / name)])
        assert config.updates >= 1
    default, _ = load_config(["--config", str(REPO / "configs" / "default.yaml")])
    assert default.model == "embedded:smollm2"


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"num_trajectories": 1}, "group of one"),
        ({"gamma": 1.5}, "gamma"),
        ({"epsilon": 0.2, "epsilon_high": 0.1}, "epsilon_high"),
        ({"beta": -0.1}, "beta"),
        ({"temperature": 0.0}, "temperature"),
        ({"max_new_tokens": 512, "max_prompt_tokens": 600}, "max_prompt_tokens"),
        ({"reward_not_compiled": 0.0, "reward_incorrect": -0.5}, "rewards must order"),
        ({"advantage_scope": "batch"}, "advantage_scope"),
        ({"no_such_field": 1}, "unknown config field"),
    ],
)
def test_bad_values_fail_with_reason_and_fix(values, fragment):
    with pytest.raises(ConfigError, match="fix") as info:
        config_from_dict(values)
    assert fragment in str(info.value)


def test_services_required_by_the_cli():
    with pytest.raises(ConfigError, match="--evaluator-url"):
        TrainConfig().require_services()


def test_every_field_has_help():
    helps = {a.dest: a.help for a in build_parser()._actions}
    missing = [f for f in TrainConfig.model_fields if not helps.get(f)]
    assert not missing


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("updates: abc\n", ["c.yaml:1", "updates", "'abc'", "an integer"]),
        ("seed: 1\nnum_trajectories: [1, 2]\n", ["c.yaml:2", "num_trajectories", "[1, 2]"]),
        ("updates: 1.5\n", ["c.yaml:1", "fractional", "1.5"]),
        ("updates: 2\n  bad: [\n", ["c.yaml:2:", "invalid YAML"]),
        ("- a\n- b\n", ["expected a mapping"]),
    ],
)
def test_bad_yaml_names_file_line_field_and_value(tmp_path, text, fragments):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="fix") as info:
        load_config(["--config", str(path)])
    for fragment in fragments:
        assert fragment in str(info.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(["--config", str(tmp_path / "nope.yaml")])


def test_flags_none_and_no_abbreviations(capsys):
    config, args = load_config(["--speedup-cap", "none", "--epsilon-high", "0.3", "--log-level", "DEBUG"])
    assert config.speedup_cap is None and args.log_level == "DEBUG"
    with pytest.raises(ConfigError, match="--updates: updates"):
        load_config(["--updates", "1.5"])
    with pytest.raises(SystemExit) as exit_info:
        load_config(["--learning-rat", "0.1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--learning-rat" in err


def test_help_shows_defaults():
    text = build_parser().format_help()
    assert "(default: 100)" in text and "KERNEL_AGENT_TOKEN" in text
    assert "--num_trajectories" not in text  # one spelling per field in the help


def test_cli_prints_one_line_and_exits_2(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "c.yaml"
    path.write_text("updates: abc\n")
    result = subprocess.run(
        [sys.executable, "-m", "services.trainer", "--config", str(path)], capture_output=True, text=True, cwd=REPO
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1


def test_token_hint_names_the_variable(monkeypatch):
    from services.trainer.config import token_hint

    monkeypatch.delenv("MY_TOKEN", raising=False)
    assert "$MY_TOKEN (now unset" in token_hint(TrainConfig(api_token_env="MY_TOKEN"))


def test_kernel_agent_train_is_the_same_command(capsys):
    from services.cli import main as kernel_agent

    with pytest.raises(SystemExit) as info:
        kernel_agent(["train", "--help"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: kernel-agent train")
    assert kernel_agent(["train", "--updates", "0", "--evaluator-url", "a", "--implementer-url", "b"]) == 2


@pytest.mark.parametrize("name", ["default.yaml", "qwen2-gpt4o.yaml"])
def test_shipped_configs_give_turn_position_no_advantage(name):
    """Every trajectory writes the same kernel at every turn: whatever the turn, nothing was better than anything
    else, so no sample may gain or lose (over the whole group, discounting alone would rank turn 0 first)."""
    from services.trainer.episodes import Turn
    from services.trainer.grpo import assign_returns_and_advantages

    config, _ = load_config(["--config", str(REPO / "configs" / name)])
    turns = [
        Turn("p", 0, j, t, [1], [2], "s", True, reward=1.2)
        for j in range(config.num_trajectories)
        for t in range(config.max_steps_per_episode)
    ]
    samples = assign_returns_and_advantages(turns, config)
    assert [t.advantage for t in samples] == [0.0] * len(turns)


@pytest.mark.parametrize("name", ["default.yaml", "qwen2-gpt4o.yaml"])
def test_shipped_lora_configs_learn_at_a_lora_rate(name):
    config, _ = load_config(["--config", str(REPO / "configs" / name)])
    assert not config.use_lora or config.learning_rate >= 5e-5  # 1e-5 barely moves adapters that start at zero


def test_the_offline_config_lists_the_techniques_and_the_design_config_does_not():
    default, _ = load_config(["--config", str(REPO / "configs" / "default.yaml")])
    design, _ = load_config(["--config", str(REPO / "configs" / "qwen2-gpt4o.yaml")])
    assert default.prompt_techniques and not design.prompt_techniques
