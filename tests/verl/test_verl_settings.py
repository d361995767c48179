"""The parts of the VERL bridge that need no VERL: the ``agentbolt`` settings' checks, the message when the ``verl``
extra is missing, and the gateway address the daemon publishes to runners on other nodes.

These run in the main virtualenv (the ``verl`` marker's tests, in ``test_verl_bridge.py``, need VERL installed).
"""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest
from support.servers import REPO
from support.vllm import stand_in_server

import agentbolt as agl
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.utils.server_launcher import pick_free_port
from agentbolt.verl.daemon import AgentModeDaemon

VERL_INSTALLED = importlib.util.find_spec("verl.trainer") is not None  # tests/verl is a namespace "verl" too
without_verl = pytest.mark.skipif(VERL_INSTALLED, reason="checks the message shown when the 'verl' extra is missing")


# ---------------------------------------------------------------------------------------------------------------
# the agentbolt section of the configuration

DEFAULTS: Dict[str, Any] = {
    "port": 9999,
    "gateway_host": "127.0.0.1",
    "rollout_timeout": 3600,
    "reward_fillna_value": 0.0,
    "agent_match": None,
    "instrument_vllm": True,
    "store": None,
    "trace_aggregator": {
        "level": "transition",
        "trajectory_max_prompt_length": 2048,
        "trajectory_max_response_length": 8192,
        "debug": False,
        "mismatch_log_dir": "./mismatch_cases",
    },
}


def _settings(**changes: Any) -> Dict[str, Any]:
    settings = {**DEFAULTS, "trace_aggregator": dict(DEFAULTS["trace_aggregator"])}
    for key, value in changes.items():
        if key.startswith("trace_aggregator__"):
            settings["trace_aggregator"][key.removeprefix("trace_aggregator__")] = value
        else:
            settings[key] = value
    return settings


def test_the_packaged_settings_are_accepted() -> None:
    import yaml

    from agentbolt.verl.configuration import check_agentbolt_settings

    packaged = yaml.safe_load((REPO / "agentbolt" / "verl" / "config.yaml").read_text())["agentbolt"]
    assert packaged == DEFAULTS
    check_agentbolt_settings(packaged)
    check_agentbolt_settings(_settings(agent_match="^solver$", store="http://head:4747", port=0))


@pytest.mark.parametrize(
    "changes, error, message",
    [
        ({"rollout_timout": 60}, ValueError, r"unknown key agentbolt\.rollout_timout"),
        ({"trace_aggregator__levle": "trajectory"}, ValueError, r"unknown key agentbolt\.trace_aggregator\.levle"),
        ({"port": "abc"}, TypeError, r"agentbolt\.port must be an integer"),
        ({"port": 70000}, ValueError, r"agentbolt\.port must be at most 65535"),
        ({"gateway_host": ""}, ValueError, r"agentbolt\.gateway_host must be a non-empty string"),
        ({"rollout_timeout": 0}, ValueError, r"agentbolt\.rollout_timeout must be positive"),
        ({"rollout_timeout": "1h"}, TypeError, r"agentbolt\.rollout_timeout must be a number"),
        ({"reward_fillna_value": float("nan")}, ValueError, r"agentbolt\.reward_fillna_value must be a finite"),
        (
            {"agent_match": "solver("},
            ValueError,
            r"agentbolt\.agent_match must be a regular expression; 'solver\(' is not",
        ),
        ({"instrument_vllm": "no"}, TypeError, r"agentbolt\.instrument_vllm must be True or False"),
        ({"store": "head:4747"}, ValueError, r"agentbolt\.store must be an http:// or https:// URL"),
        ({"trace_aggregator": "trajectory"}, TypeError, r"agentbolt\.trace_aggregator must be a mapping"),
        ({"trace_aggregator__level": "step"}, ValueError, r"agentbolt\.trace_aggregator\.level must be one of"),
        (
            {"trace_aggregator__trajectory_max_prompt_length": 0},
            ValueError,
            r"agentbolt\.trace_aggregator\.trajectory_max_prompt_length must be at least 1",
        ),
        ({"trace_aggregator__debug": 1}, TypeError, r"agentbolt\.trace_aggregator\.debug must be True or False"),
    ],
)
def test_broken_settings_are_refused_naming_the_key(changes: Dict[str, Any], error: type, message: str) -> None:
    from agentbolt.verl.configuration import check_agentbolt_settings

    with pytest.raises(error, match=message):
        check_agentbolt_settings(_settings(**changes))


def test_settings_that_are_not_a_mapping_are_refused() -> None:
    from agentbolt.verl.configuration import check_agentbolt_settings

    with pytest.raises(TypeError, match="the agentbolt section must be a mapping"):
        check_agentbolt_settings(["port", 9999])


# ---------------------------------------------------------------------------------------------------------------
# the verl extra missing


@without_verl
def test_python_m_agentbolt_verl_without_the_extra_says_which_extra_to_install() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agentbolt.verl", "agentbolt.store=http://127.0.0.1:1"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "pip install 'agentbolt[verl]'" in done.stderr


@without_verl
@pytest.mark.parametrize("name", ["AgentLightningTrainer", "run_ppo", "TaskRunner", "main"])
def test_verl_names_without_the_extra_raise_an_import_error_naming_it(name: str) -> None:
    import agentbolt.verl

    with pytest.raises(ImportError, match=r"pip install 'agentbolt\[verl\]'"):
        getattr(agentbolt.verl, name)


@without_verl
def test_composing_the_config_without_the_extra_names_it() -> None:
    from agentbolt.verl.configuration import compose_config

    with pytest.raises(ImportError, match=r"pip install 'agentbolt\[verl\]'"):
        compose_config({})
    with pytest.raises(ImportError, match=r"pip install 'agentbolt\[verl\]'"):
        agl.VERL({})


# ---------------------------------------------------------------------------------------------------------------
# the gateway address given to runners on other nodes


@pytest.fixture
def vllm_stand_in() -> Iterator[Any]:
    """The vLLM stand-in (tests/support/vllm_stand_in) started through ``agentbolt vllm serve``."""
    with stand_in_server() as server:
        yield server


def test_a_gateway_on_every_interface_is_published_at_the_address_it_announces(
    vllm_stand_in: Any, tmp_path: Path
) -> None:
    store = SqliteLightningStore(tmp_path / "store.db")
    daemon = AgentModeDaemon(store, adapter=agl.LlmProxyTraceToTriplet(), host="0.0.0.0", port=pick_free_port())
    try:
        daemon.set_up_data_and_server([{"q": 1}], [vllm_stand_in.root_url.removeprefix("http://")])
        assert daemon.llm_proxy is not None
        latest = asyncio.run(store.get_latest_resources())
        assert latest is not None
        llm = latest.resources["main_llm"]
        # the gateway's own access address (the node's outbound address), not the host name's /etc/hosts entry,
        # which is a loopback address on many machines and unreachable from other nodes
        assert llm.endpoint == daemon.llm_proxy.endpoint
    finally:
        daemon.close()
        asyncio.run(store.close())


def test_a_taken_gateway_port_is_refused_when_the_daemon_is_made_naming_the_setting(tmp_path: Path) -> None:
    from support.servers import taken_port

    store = SqliteLightningStore(tmp_path / "store.db")
    try:
        with taken_port() as port:
            message = rf"agentbolt\.port {port}: .*cannot listen on 127\.0\.0\.1:{port}"
            with pytest.raises(RuntimeError, match=message):
                AgentModeDaemon(store, adapter=agl.LlmProxyTraceToTriplet(), port=port)
    finally:
        asyncio.run(store.close())
