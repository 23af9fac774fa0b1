"""How a LoRA run names its policy adapters on the engines, and which ones a publication retires."""

from __future__ import annotations

from gyre.engine.adapters import adapter_name, adapter_version, stale_adapters


def test_versions_and_names() -> None:
    assert adapter_name(7) == "policy-v7" and adapter_name("7") == "policy-v7"
    assert adapter_name(0) is None and adapter_name("0") is None and adapter_name("base") is None
    assert adapter_name(None) is None
    assert adapter_version("policy-v12") == 12 and adapter_version("mine") is None


def test_a_publication_keeps_the_newest_two_policy_adapters() -> None:
    loaded = ["policy-v2", "policy-v4", "policy-v6", "mine", "policy-v8"]
    assert stale_adapters(loaded, 6) == ["policy-v2"]
    assert stale_adapters(loaded, 8) == ["policy-v2", "policy-v4"]
    assert stale_adapters(["policy-v2"], 2) == []
