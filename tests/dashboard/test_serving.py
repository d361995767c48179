"""The dashboard app on the store server: index for every page path, hashed assets cached, /v1 paths untouched,
pages open without the API key while the data stays protected."""

from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator

import httpx
import pytest
from support.servers import free_port

from agentbolt.store.client_server import LightningStoreServer
from agentbolt.store.dashboard import DASHBOARD_DIR, _relative_base
from agentbolt.store.memory import InMemoryLightningStore

API_KEY = "s3cret-token"


@pytest.fixture
async def server() -> AsyncIterator[LightningStoreServer]:
    served = LightningStoreServer(
        InMemoryLightningStore(thread_safe=True), host="127.0.0.1", port=free_port(), api_key=API_KEY
    )
    await served.start()
    try:
        yield served
    finally:
        await served.stop()


def test_the_built_dashboard_ships_in_the_package() -> None:
    assert (DASHBOARD_DIR / "index.html").is_file()
    assets = list((DASHBOARD_DIR / "assets").iterdir())
    assert any(p.suffix == ".js" for p in assets) and any(p.suffix == ".css" for p in assets)


@pytest.mark.parametrize(
    ("path", "base"),
    [
        ("/", "./"),
        ("/rollouts", "./"),
        ("/rollouts/", "../"),
        ("/rollouts/ro-1", "../"),
        ("/rollouts/a/attempts/b", "../../../"),
    ],
)
def test_the_base_href_leads_back_to_the_root(path: str, base: str) -> None:
    assert _relative_base(path) == base


async def test_every_page_path_gets_the_app_without_the_key(server: LightningStoreServer) -> None:
    async with httpx.AsyncClient(base_url=server.endpoint) as http:
        for path in ("/", "/rollouts", "/rollouts/ro-unknown/attempts/at-1", "/training?run=x", "/settings"):
            answer = await http.get(path)
            assert answer.status_code == 200, path
            assert answer.headers["content-type"].startswith("text/html")
            assert answer.headers["cache-control"] == "no-cache"
            assert '<base href="' in answer.text and "assets/app-" in answer.text
        nested = await http.get("/rollouts/ro-1/attempts/at-2")
        assert '<base href="../../../">' in nested.text


async def test_an_encoded_slash_in_an_id_is_not_a_level_of_the_base_href(server: LightningStoreServer) -> None:
    # A resources id may hold a "/": its page's address escapes it ("%2F"), and the browser resolves the base from that
    # address, where the id is one segment. Counted as two, the base would lead above a proxy's path prefix.
    async with httpx.AsyncClient(base_url=server.endpoint) as http:
        answer = await http.get("/resources/team%2Fprompt%2Fv2")
    assert answer.status_code == 200
    assert '<base href="../">' in answer.text


async def test_assets_are_cached_for_a_year_and_unknown_ones_are_404(server: LightningStoreServer) -> None:
    script = next(p.name for p in (DASHBOARD_DIR / "assets").iterdir() if p.suffix == ".js")
    async with httpx.AsyncClient(base_url=server.endpoint) as http:
        answer = await http.get(f"/assets/{script}")
        missing = await http.get("/assets/app-NOPE.js")
    assert answer.status_code == 200 and "immutable" in answer.headers["cache-control"]
    assert "javascript" in answer.headers["content-type"]
    assert missing.status_code == 404


async def test_unknown_api_paths_stay_404_and_data_needs_the_key(server: LightningStoreServer) -> None:
    auth = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(base_url=server.endpoint) as http:
        assert (await http.get("/v1/agl/nothing-here", headers=auth)).status_code == 404
        assert (await http.get("/v1/whatever", headers=auth)).status_code == 404
        assert (await http.get("/v1/agl/rollouts")).status_code == 401
        assert (await http.get("/v1/agl/dashboard/rollouts")).status_code == 401
        assert (await http.get("/v1/agl/metrics")).status_code == 401
        assert (await http.get("/openapi.json")).status_code == 401
        assert (await http.get("/v1/agl/dashboard/rollouts", headers=auth)).status_code == 200
        assert (await http.post("/rollouts")).status_code in (401, 404)  # no such path, whatever the method


async def test_a_server_without_a_built_dashboard_still_serves_the_api(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from fastapi import FastAPI

    from agentbolt.store.dashboard import install_dashboard

    async def call(name: str, *args: object, **kwargs: object) -> None:
        return None

    app = FastAPI()
    install_dashboard(app, call, directory=tmp_path / "missing")
    assert "not built" in caplog.text
    assert not any(getattr(route, "path", "") == "/{path:path}" for route in app.routes)


async def test_pages_run_only_the_apps_own_scripts(server: LightningStoreServer) -> None:
    # Agents' text is rendered as text; should any ever reach the page as markup, the browser still runs no inline
    # script or handler, and nothing can re-point the page's relative addresses through a <base> element.
    async with httpx.AsyncClient(base_url=server.endpoint) as http:
        answer = await http.get("/rollouts/ro-1")
    policy = {d.split()[0]: d.split()[1:] for d in answer.headers["content-security-policy"].split("; ")}
    assert policy["script-src"] == ["'self'"] and policy["object-src"] == ["'none'"]
    assert policy["base-uri"] == ["'self'"]
    assert answer.headers["x-content-type-options"] == "nosniff"
