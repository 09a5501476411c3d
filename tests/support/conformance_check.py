"""Black-box conformance check of a Sessions API server (the emulator or anything like it).

Run against a live server with two keys of two different accounts::

    python -m tests.support.conformance_check --base-url http://127.0.0.1:8080 \
        --key K1 --other-key K2

(from the repository's root, with this venv's python).

Plain httpx, nothing imported from sessionhook: it checks what the spec (and the field
notes) promise on the wire. Prints ``PASS``/``FAIL`` per check and exits 1 when any check
fails. ``--no-emulator-extras`` skips the checks of emulator-only behaviour (the
``x-emulator-fault`` header). Not a pytest module: pytest does not collect this file.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from tests.support.standin import EVENT_MEMBERS

TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")
HEX32 = re.compile(r"^[0-9a-f]{32}$")
BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest"
Json = dict[str, Any]


class Conformance:
    """The checks, sharing two clients (one per account) and a results tally."""

    def __init__(self, base_url: str, key: str, other_key: str, timeout: float) -> None:
        self.base = base_url.rstrip("/") + "/v1alpha"
        self.api = httpx.Client(base_url=self.base, headers={"x-vendor-api-key": key}, timeout=15)
        self.other = httpx.Client(
            base_url=self.base, headers={"X-Vendor-Api-Key": other_key}, timeout=15
        )
        self.anonymous = httpx.Client(base_url=self.base, timeout=15)
        self.key = key
        self.timeout = timeout
        self.failures = 0
        self.passes = 0

    @contextmanager
    def check(self, name: str) -> Iterator[None]:
        try:
            yield
        except Exception as exc:  # any surprise from the server is a failed check, not a crash
            self.failures += 1
            where = traceback.extract_tb(exc.__traceback__)[-1].lineno
            print(f"FAIL {name}: {type(exc).__name__}: {exc} (line {where})", flush=True)
        else:
            self.passes += 1
            print(f"PASS {name}", flush=True)

    # ------------------------------------------------------------------ helpers

    def error(self, response: httpx.Response, code: int, status: str) -> Json:
        assert response.status_code == code, f"{response.status_code} {response.text[:200]}"
        body = response.json()
        error: Json = body["error"]
        assert error["code"] == code, error
        assert error["status"] == status, error
        assert isinstance(error["message"], str) and error["message"], error
        return error

    def violation_fields(self, response: httpx.Response) -> list[str | None]:
        error = self.error(response, 400, "INVALID_ARGUMENT")
        (detail,) = [d for d in error["details"] if d.get("@type") == BAD_REQUEST]
        return [v.get("field") for v in detail["fieldViolations"]]

    def walk(self, client: httpx.Client, path: str, key: str, **params: Any) -> list[Json]:
        items: list[Json] = []
        token = None
        for _ in range(1000):
            query = dict(params, **({"pageToken": token} if token else {}))
            response = client.get(path, params=query)
            assert response.status_code == 200, response.text[:200]
            body = response.json()
            page = body.get(key, [])
            if "pageSize" in params:
                assert len(page) <= int(params["pageSize"])
            items += page
            token = body.get("nextPageToken")
            if not token:
                assert "nextPageToken" not in body, "an empty nextPageToken on the last page"
                return items
        raise AssertionError("pagination never ended")

    def create(self, client: httpx.Client | None = None, **body: Any) -> Json:
        body.setdefault("prompt", "Fix the flaky retry test")
        response = (client or self.api).post("/sessions", json=body)
        assert response.status_code == 200, response.text[:300]
        created: Json = response.json()
        return created

    def wait_for(self, session_id: str, predicate: Callable[[Json], bool], what: str) -> Json:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            response = self.api.get(f"/sessions/{session_id}")
            if response.status_code == 200 and predicate(response.json()):
                session: Json = response.json()
                return session
            time.sleep(0.1)
        raise AssertionError(f"session {session_id} never reached {what} in {self.timeout}s")

    def wait_state(self, session_id: str, *states: str) -> Json:
        return self.wait_for(session_id, lambda s: s.get("state") in states, "/".join(states))

    def activities(self, session_id: str, **params: Any) -> list[Json]:
        return self.walk(self.api, f"/sessions/{session_id}/activities", "activities", **params)

    # ------------------------------------------------------------------ checks

    def run(self, extras: bool) -> int:
        sections: list[Callable[[], None]] = [
            self.auth,
            self.sources,
            self.sessions,
            self.errors,
            self.agent_and_activities,
            self.plan_approval,
            self.messages,
            self.delete,
        ]
        for section in [*sections, *([self.emulator_faults] if extras else [])]:
            try:
                section()
            except Exception as exc:  # a section's set-up failed: count it, run the others
                self.failures += 1
                print(f"FAIL {section.__name__}: set-up: {type(exc).__name__}: {exc}", flush=True)
        print(f"{self.passes} passed, {self.failures} failed", flush=True)
        return 1 if self.failures else 0

    def auth(self) -> None:
        with self.check("auth: a missing key is 401 UNAUTHENTICATED"):
            error = self.error(self.anonymous.get("/sessions"), 401, "UNAUTHENTICATED")
            assert "key" in error["message"].lower()
        with self.check("auth: an unknown key is 401 and says the key is not valid"):
            response = self.anonymous.get("/sources", headers={"x-vendor-api-key": "no-such-key"})
            assert "not valid" in self.error(response, 401, "UNAUTHENTICATED")["message"]
        with self.check("auth: the header name is case-insensitive"):
            response = self.anonymous.get("/sources", headers={"X-VENDOR-API-KEY": self.key})
            assert response.status_code == 200

    def sources(self) -> None:
        sources: list[Json] = []
        with self.check("sources: list, names sources/github/<owner>/<repo>, no token at the end"):
            sources = self.walk(self.api, "/sources", "sources")
            assert sources, "no sources connected"
            for source in sources:
                assert source["name"] == "sources/" + source["id"], source
                assert source["name"].startswith("sources/"), source
        with self.check("sources: pageSize=1 walks the same sources"):
            assert self.walk(self.api, "/sources", "sources", pageSize=1) == sources
        with self.check("sources: get one includes its branches"):
            name = sources[0]["name"]
            response = self.api.get("/" + name)
            assert response.status_code == 200, response.text[:200]
            assert response.json()["name"] == name
            assert response.json()["hostRepo"]["branches"], "no branches"
        with self.check("sources: an unknown source is 404 NOT_FOUND"):
            self.error(self.api.get("/sources/github/no-such/repo-here"), 404, "NOT_FOUND")
        with self.check("sources: filter name=... OR name=..."):
            wanted = [s["name"] for s in sources[:2]]
            expression = " OR ".join(f'name="{n}"' for n in wanted)
            got = self.walk(self.api, "/sources", "sources", filter=expression)
            assert sorted(s["name"] for s in got) == sorted(wanted)
        with self.check("sources: a malformed filter is 400 on filter"):
            response = self.api.get("/sources", params={"filter": "name=="})
            assert "filter" in self.violation_fields(response)

    def sessions(self) -> None:
        source = self.walk(self.api, "/sources", "sources")[0]["name"]
        context = {"source": source}
        created: Json = {}
        ids: list[str] = []
        with self.check("sessions: create answers a QUEUED session"):
            created = self.create(sourceContext=context)
            assert re.fullmatch(r"\d{15,25}", created["id"]), created["id"]
            assert created["name"] == "sessions/" + created["id"]
            assert created["state"] == "QUEUED"
            assert TIMESTAMP.match(created["createTime"]), created["createTime"]
            assert created["sourceContext"] == context
            assert created["title"]
        with self.check("sessions: get answers the full session"):
            got = self.api.get(f"/sessions/{created['id']}").json()
            assert got["id"] == created["id"] and got["prompt"] and got["url"]
        with self.check("sessions: list items carry the reduced set, newest first"):
            newer = self.create(prompt="A second session")
            listed = self.walk(self.api, "/sessions", "sessions")
            ids = [s["id"] for s in listed]
            assert ids.index(newer["id"]) < ids.index(created["id"])
            allowed = {"name", "id", "title", "state", "createTime", "updateTime"}
            assert all(set(s) <= allowed for s in listed), listed[0]
        with self.check("sessions: pageSize=1 walks the same sessions"):
            assert [
                s["id"] for s in self.walk(self.api, "/sessions", "sessions", pageSize=1)
            ] == ids
        for size in ("0", "101", "abc"):
            with self.check(f"paging: pageSize={size} is 400 on page_size"):
                response = self.api.get("/sessions", params={"pageSize": size})
                assert self.violation_fields(response) == ["page_size"]
        with self.check("paging: a garbage page token is 400 INVALID_ARGUMENT"):
            response = self.api.get("/sessions", params={"pageToken": "garbage"})
            self.error(response, 400, "INVALID_ARGUMENT")

    def errors(self) -> None:
        session = self.create(prompt="Owned by the first account")
        path = f"/sessions/{session['id']}"
        with self.check("errors: create without prompt is 400 on prompt"):
            assert "prompt" in self.violation_fields(self.api.post("/sessions", json={"x": 1}))
        with self.check("errors: malformed JSON is 400 INVALID_ARGUMENT"):
            response = self.api.post(
                "/sessions", content=b"{nope", headers={"content-type": "application/json"}
            )
            self.error(response, 400, "INVALID_ARGUMENT")
        with self.check("errors: an unconnected source is 400 on source_context.source"):
            response = self.api.post(
                "/sessions", json={"prompt": "p", "sourceContext": {"source": "sources/github/x/y"}}
            )
            assert "source_context.source" in self.violation_fields(response)
        with self.check("errors: an unknown session is 404 NOT_FOUND"):
            self.error(self.api.get("/sessions/1234567890123456789"), 404, "NOT_FOUND")
        with self.check("errors: another account's session is 403 and not listed"):
            self.error(self.other.get(path), 403, "PERMISSION_DENIED")
            self.error(self.other.get(path + "/activities"), 403, "PERMISSION_DENIED")
            theirs = self.walk(self.other, "/sessions", "sessions")
            assert session["id"] not in {s["id"] for s in theirs}
        with self.check("errors: an unknown route is 404 with an error body"):
            self.error(self.api.get("/no-such-collection"), 404, "NOT_FOUND")
        with self.check("errors: a wrong method is 405 with an error body"):
            response = self.api.put("/sessions", json={})
            assert response.status_code == 405 and response.json()["error"]["code"] == 405

    def agent_and_activities(self) -> None:
        created = self.create(prompt="Add a --verbose flag")
        session_id = created["id"]
        every: list[Json] = []
        with self.check("agent: a default session reaches COMPLETED"):
            final = self.wait_state(session_id, "COMPLETED")
            every = self.activities(session_id)
            assert final["updateTime"] >= every[-1]["createTime"]
        with self.check("activities: shapes, at most one event member, oldest first"):
            assert every, "no activities"
            for activity in every:
                assert activity["name"] == f"sessions/{session_id}/activities/{activity['id']}"
                assert HEX32.match(activity["id"]) and TIMESTAMP.match(activity["createTime"])
                assert sum(m in activity for m in EVENT_MEMBERS) <= 1, activity
            times = [a["createTime"] for a in every]
            assert times == sorted(times)
            kinds = [next((m for m in EVENT_MEMBERS if m in a), None) for a in every]
            assert {"planGenerated", "planApproved", "sessionCompleted"} <= set(kinds)
            assert kinds[-1] == "sessionCompleted"
        with self.check("activities: pageSize=1 walks the same activities"):
            assert self.activities(session_id, pageSize=1) == every
        with self.check("activities: get one equals the listed one"):
            middle = every[len(every) // 2]
            assert (
                self.api.get(f"/sessions/{session_id}/activities/{middle['id']}").json() == middle
            )
        with self.check("activities: createTime keeps a suffix (exclusive, inclusive or ignored)"):
            pivot = len(every) // 2
            got = self.activities(session_id, createTime=every[pivot]["createTime"])
            assert got in (every[pivot + 1 :], every[pivot:], every), [a["id"] for a in got]
        with self.check("activities: a bad createTime is 400"):
            response = self.api.get(f"/sessions/{session_id}/activities?createTime=yesterday")
            self.error(response, 400, "INVALID_ARGUMENT")
        with self.check("activities: an unknown activity is 404"):
            response = self.api.get(f"/sessions/{session_id}/activities/{'0' * 32}")
            self.error(response, 404, "NOT_FOUND")

    def plan_approval(self) -> None:
        session_id = self.create(prompt="Refactor the parser", requirePlanApproval=True)["id"]
        with self.check("approvePlan: a session waits in AWAITING_PLAN_APPROVAL"):
            self.wait_state(session_id, "AWAITING_PLAN_APPROVAL")
        with self.check("approvePlan: answers {} and the session goes on"):
            response = self.api.post(f"/sessions/{session_id}:approvePlan", json={})
            assert response.status_code == 200 and response.json() == {}, response.text
            self.wait_state(session_id, "IN_PROGRESS", "COMPLETED")
            assert any("planApproved" in a for a in self.activities(session_id))
        with self.check("approvePlan: nothing awaiting approval is 400"):
            response = self.api.post(f"/sessions/{session_id}:approvePlan", json={})
            assert response.status_code == 400

    def messages(self) -> None:
        session_id = self.create(prompt="Bump the version")["id"]
        self.wait_state(session_id, "COMPLETED")
        before = self.api.get(f"/sessions/{session_id}").json()
        with self.check("sendMessage: answers {} and a userMessaged activity appears"):
            response = self.api.post(
                f"/sessions/{session_id}:sendMessage", json={"prompt": "thanks"}
            )
            assert response.status_code == 200 and response.json() == {}, response.text
            assert any(
                a.get("userMessaged", {}).get("userMessage") == "thanks"
                for a in self.activities(session_id)
            )
        with self.check("sendMessage: the agent replies and a completed session resumes"):
            self.wait_for(
                session_id, lambda s: s["updateTime"] > before["updateTime"], "a later update"
            )
            self.wait_state(session_id, "COMPLETED")
            kinds = [
                next((m for m in EVENT_MEMBERS if m in a), None)
                for a in self.activities(session_id)
            ]
            assert kinds.count("sessionCompleted") == 2 and "agentMessaged" in kinds
        with self.check("sendMessage: without prompt is 400 on prompt"):
            response = self.api.post(f"/sessions/{session_id}:sendMessage", json={})
            assert "prompt" in self.violation_fields(response)

    def delete(self) -> None:
        session_id = self.create(prompt="Short-lived")["id"]
        with self.check("delete: answers {} and the session is 404 afterwards"):
            response = self.api.delete(f"/sessions/{session_id}")
            assert response.status_code == 200 and response.json() == {}
            self.error(self.api.get(f"/sessions/{session_id}"), 404, "NOT_FOUND")

    def emulator_faults(self) -> None:
        with self.check("emulator: x-emulator-fault 429 is RESOURCE_EXHAUSTED with Retry-After"):
            response = self.api.get("/sources", headers={"x-emulator-fault": "429"})
            error = self.error(response, 429, "RESOURCE_EXHAUSTED")
            assert error["message"] == "Resource has been exhausted (e.g. check quota)."
            assert response.headers["retry-after"] == "1"
        with self.check("emulator: x-emulator-fault 500 is INTERNAL"):
            self.error(
                self.api.get("/sources", headers={"x-emulator-fault": "500"}), 500, "INTERNAL"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="service address, without /v1alpha")
    parser.add_argument("--key", required=True, help="an API key of account A")
    parser.add_argument("--other-key", required=True, help="an API key of another account")
    parser.add_argument("--timeout", type=float, default=60, help="seconds to wait for a state")
    parser.add_argument(
        "--no-emulator-extras", action="store_true", help="skip emulator-only checks"
    )
    args = parser.parse_args(argv)
    checks = Conformance(args.base_url, args.key, args.other_key, args.timeout)
    try:
        return checks.run(extras=not args.no_emulator_extras)
    except httpx.HTTPError as exc:
        print(f"FAIL cannot talk to {args.base_url}: {exc}", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
