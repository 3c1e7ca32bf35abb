"""Only allowlisted variables leave the node, and credentials never do."""

import pytest
from hypothesis import given, strategies as st

from ncclwatch.envpolicy import REDACTED, filter_env, is_allowed, redact_value
from ncclwatch.jobid import identify

SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
    "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz0123",
    "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
    "NCCL_IB_SECRET_THING": "topsecret",
    "TORCH_NCCL_AUTH_TOKEN": "abc",
    "PATH": "/usr/bin", "HOME": "/root",
}


def test_non_allowlisted_and_secret_names_are_dropped() -> None:
    env = {**SECRETS, "NCCL_DEBUG": "INFO", "RANK": "3", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
    out = filter_env(env)
    assert out == {"NCCL_DEBUG": "INFO", "RANK": "3", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}


@pytest.mark.parametrize("value,secret", [
    ("tcp://admin:hunter2@10.0.0.1:29500", "hunter2"),
    ("etcd://user:p4ss@host/x?token=abc123", "p4ss"),
    ("host=x;password=sw0rdfish;port=1", "sw0rdfish"),
    ("AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    ("hf_abcdefghijklmnopqrstuvwxyz0123", "hf_abcdefghijklmnopqrstuvwxyz"),
    ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.sig", "eyJzdWIiOiIxMjM0In0"),
    ("Zm9vYmFyQmF6UXV4MTIzNDU2Nzg5MGFiY2RlZg==", "Zm9vYmFyQmF6UXV4"),
    ("trainer:MasterPw9876@10.0.0.7", "MasterPw9876"),      # no scheme
    ("a=1,svc:pw0rd@store:2379", "pw0rd"),
    # a token inside a path: no word boundary before it
    ("/tmp/fr_ghp_abcdefghijklmnopqrstuvwxyz0123", "ghp_abcdefghijklmnop"),
    ("s3://bucket/x_hf_abcdefghijklmnopqrstuvwxyz0123/y", "hf_abcdefghijklmnop"),
])
def test_credential_looking_values_are_redacted(value, secret) -> None:
    out = redact_value(value)
    assert secret not in out and REDACTED in out


@pytest.mark.parametrize("value", [
    "INFO", "eth0,eth1", "mlx5_0:1,mlx5_1:1", "10.0.0.1", "0a1b2c3d-0000-1111-2222-333344445555",
    "/tmp/nccl_trace_rank_", "expandable_segments:True"])
def test_ordinary_values_stay_readable(value) -> None:
    assert redact_value(value) == value


@given(st.dictionaries(st.text(min_size=1, max_size=30), st.text(max_size=60), max_size=30))
def test_filter_env_never_keeps_a_name_outside_the_allowlist(env) -> None:
    for name in filter_env(env):
        assert is_allowed(name)


def test_job_id_is_shared_by_ranks_and_differs_between_jobs() -> None:
    base = {"WORLD_SIZE": "8", "MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "29500"}
    a = identify({**base, "RANK": "0", "TORCHELASTIC_RUN_ID": "run-a"}, "n1")
    b = identify({**base, "RANK": "7", "TORCHELASTIC_RUN_ID": "run-a"}, "n2")
    c = identify({**base, "RANK": "0", "TORCHELASTIC_RUN_ID": "run-b"}, "n1")
    assert a.job_id == b.job_id != c.job_id
    assert (a.rank, b.rank, a.world_size) == (0, 7, 8)


@pytest.mark.parametrize("env,job_id", [
    ({"NCCLWATCH_JOB_ID": "mine", "TORCHELASTIC_RUN_ID": "x"}, "mine"),
    ({"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0"}, "slurm:42.0"),
    ({"MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "1234"}, "master:10.0.0.2:1234/2"),
    # A loopback rendezvous cannot span nodes: the node name scopes it.
    ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1234"}, "master:nodeA/127.0.0.1:1234/2"),
])
def test_job_id_sources(env, job_id) -> None:
    ident = identify({"RANK": "1", "WORLD_SIZE": "2", **env}, "nodeA")
    assert ident is not None and ident.job_id == job_id


def test_job_id_from_a_credentialed_rendezvous_is_redacted_and_still_shared() -> None:
    """MASTER_ADDR=user:password@host must not put the password in the job id."""
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "trainer:MasterPw9876@10.0.0.7",
           "MASTER_PORT": "29500"}
    a, b = identify({**env, "RANK": "0"}, "n1"), identify({**env, "RANK": "1"}, "n2")
    assert "MasterPw9876" not in a.job_id and "10.0.0.7:29500" in a.job_id
    assert a.job_id == b.job_id
    # A run id that merely looks random stays distinct (no whole-value redaction).
    r1 = identify({"RANK": "0", "WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "Xk3jQ9vLm2Np8Rt5"
                   "Wz7Yb4Hc6Df1Gs0A"}, "n")
    r2 = identify({"RANK": "0", "WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "Ab3jQ9vLm2Np8Rt5"
                   "Wz7Yb4Hc6Df1Gs0A"}, "n")
    assert r1.job_id != r2.job_id


@pytest.mark.parametrize("env", [
    {"RANK": "0"},
    {"RANK": "0", "WORLD_SIZE": "2"},  # no job source at all
])
def test_not_a_rank(env) -> None:
    assert identify(env, "n") is None


@pytest.mark.parametrize("env", [
    {"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"},
    {"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"},
])
def test_a_bad_rank_is_an_unknown_member_never_a_number(env) -> None:
    ident = identify(env, "n")
    assert ident is not None and not ident.known and ident.rank_source == "unknown"
