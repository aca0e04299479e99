"""A lane's cases speak the Docker API version its check found on the engine, instead of each asking the engine for
it (`GET /version`, which the engine answers by asking its runtimes for theirs: ~5-8 ms of its time a case)."""

from __future__ import annotations

import pytest
import requests
from docker.errors import APIError

from fault_runs import night
from fleetbench.engines import version_refused


def refusal(status: int, said: str) -> APIError:
    response = requests.Response()
    response.status_code = status
    return APIError(f"{status} Client Error for http+docker://localhost/v1.99/_ping: Bad Request", response=response,
                    explanation=said)


@pytest.mark.parametrize("status, said, refused", [
    (400, "client version 1.99 is too new. Maximum supported API version is 1.41", True),
    (400, "client version 1.43 is too old. Minimum supported API version is 1.44, please upgrade your client to a "
          "newer version", True),
    (400, "invalid reference format", False),  # the request's own fault: no version to drop
    (500, "client version 1.99 is too new. Maximum supported API version is 1.41", False),
])
def test_an_engines_refusal_of_the_version_is_told_from_other_errors(status, said, refused):
    assert version_refused(refusal(status, said)) is refused


def test_the_lanes_cases_carry_the_engines_api_version_from_its_images_step(tmp_path, data_dir):
    from fleetbench.airflow.operators import BenchmarkCaseOperator, case_kwargs
    from fleetbench.run_model import HostImages

    plan, validations, prepared = night(tmp_path, "r1")
    prepared[0]["api_version"] = "1.41"
    assert HostImages.load(prepared[0]).api_version == "1.41"
    [kwargs] = case_kwargs(plan, validations, prepared, host="localhost")
    assert kwargs["api_version"] == "1.41"
    assert BenchmarkCaseOperator(task_id="run_case", **kwargs).api_version == "1.41"
    del prepared[0]["api_version"]  # an XCom written before the field was there: auto
    [kwargs] = case_kwargs(plan, validations, prepared, host="localhost")
    assert kwargs["api_version"] is None


@pytest.mark.parametrize("url, reads_environment", [
    ("unix:///var/run/docker.sock", False), ("tcp://127.0.0.1:2375", True)])
def test_a_client_of_this_machines_socket_reads_nothing_from_the_environment(url, reads_environment):
    """requests looked up proxies, CA bundles and netrc in the whole environment on every call; none applies to a
    socket. A plain tcp:// engine keeps honouring the proxy variables."""
    from fleetbench.airflow.operators import BenchmarkCaseOperator
    from fleetbench.engines import docker_api_client

    assert docker_api_client(url, None, version="1.41").trust_env is reads_environment
    op = BenchmarkCaseOperator(task_id="run_case", image="x", command=["true"], docker_url=url, api_version="1.41",
                               case={"host": "h", "case_key": "k"})
    op.hook.__dict__["api_client"] = docker_api_client(url, None, version="1.41")  # made without the hook's ping
    op.hook.api_client.trust_env = True
    assert op.cli.trust_env is reads_environment


class TlsEngine:
    """docker_api_client's TLS client as a fake: refuses `refused` versions at the ping; `auto` asks the engine's
    version, which `answers` or not (docker-py's DockerException "Error while fetching server API version")."""

    made: list = []

    def __init__(self, version, refused=("9.99",), answers=True):
        from docker.errors import DockerException

        if version in (None, "auto") and not answers:
            raise DockerException("Error while fetching server API version: 500 Server Error")
        self.api_version = version if version not in (None, "auto") else "1.41"
        self.refused, self.closed = refused, False
        TlsEngine.made.append(self)

    def ping(self):
        if self.api_version in self.refused:
            raise refusal(400, f"client version {self.api_version} is too new. Maximum supported API version is 1.41")
        return True

    def close(self):
        self.closed = True


@pytest.mark.parametrize("answers", [True, False])
def test_over_tls_a_refused_version_is_asked_for_and_an_unanswered_question_is_an_engine_lost(monkeypatch, answers):
    from fleetbench import engines
    from fleetbench.airflow.operators import ENGINE_LOST, BenchmarkCaseOperator

    TlsEngine.made = []
    monkeypatch.setattr(engines, "docker_api_client",
                        lambda url, tls, timeout, version: TlsEngine(version, answers=answers))
    op = BenchmarkCaseOperator(task_id="run_case", image="x", command=["true"], docker_url="tcp://gpu-7:2376",
                               api_version="9.99", docker_tls_conn_id="tls", case={"host": "h", "case_key": "k"})
    op._tls = {"ca_cert": "ca.pem"}  # what execute's docker_tls_files yields
    if answers:
        op._connect()
        assert (op.api_version, op.cli.api_version) == (None, "1.41")
    else:  # the version query unanswered: the case's engine_unreachable, not a crash of its task
        with pytest.raises(ENGINE_LOST, match="did not answer: Error while fetching server API version"):
            op._connect()
    assert TlsEngine.made[0].api_version == "9.99" and TlsEngine.made[0].closed  # the refused client's pool closed


@pytest.mark.parametrize("said, kept", [("1.41", "1.41"), ("1.45", "1.45"), ("1.41/../x", None), ("", None),
                                        ("1" * 5000, None), (None, None), (1.41, None)])
def test_only_a_version_that_reads_as_one_is_handed_to_the_cases(said, kept):
    """It becomes part of each case's request paths and the lane's XCom: what an engine says otherwise is not kept
    (the cases then ask the engine themselves)."""
    from types import SimpleNamespace

    from fleetbench.engines import api_version_of

    assert api_version_of(SimpleNamespace(api_version=said)) == kept
    assert api_version_of(object()) is None  # a client without one
