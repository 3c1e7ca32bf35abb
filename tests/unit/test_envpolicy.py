"""Only allowlisted variables leave the node, and credentials never do."""

import pytest
from hypothesis import assume, given, strategies as st

from ncclwatch.envpolicy import REDACTED, is_allowed, redact_value
from ncclwatch.sanitize import filter_env
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


# -- structural redaction: URL data and embedded random runs ---------------------------------

import base64
import os
import random
import string

from ncclwatch.envpolicy import looks_random, redact_patterns

_KEY = st.text(string.ascii_letters + "_", min_size=1, max_size=8)
_QVALUE = st.text(string.ascii_letters + string.digits + "%+-._~/:", min_size=1, max_size=40)
#: Tokens as services issue them: random bytes in base64, base64url or hex.
_TOKEN = st.tuples(st.binary(min_size=15, max_size=48),
                   st.sampled_from([base64.b64encode, base64.urlsafe_b64encode,
                                    lambda b: b.hex().encode()])).map(lambda t: t[1](t[0]).decode())
#: Where a value may hide a token, set off by characters no token has: paths, lists,
#: URLs, pairs. (A token glued to a name by '_' is the token patterns' case, above.)
_CONTEXT = st.sampled_from([
    "{}", "/mnt/ckpt/{}/model.pt", "s3://bucket/{}/x", "/tmp/fr/{}", "{},eth0", "host=x;id={}",
    "https://h.example/p/{}", "a:{}", "{}@store:2379", "NCCL {} INFO",
])
#: Words as the rule knows them (a quarter vowels). Names of consonant clusters
#: and acronyms glued to other pieces (``scratch12000/GPT2024``) can read as
#: tokens and be redacted: the rule errs that way (docs/security.md).
_WORDS = st.sampled_from(["checkpoints", "experiments", "train", "model", "trace", "Llama",
                          "ImageNet", "users", "debug", "rank", "Medium", "final", "eval",
                          "logs", "data", "lustre", "Megatron", "Qwen", "Instruct"])


@given(st.text(string.ascii_letters, min_size=1, max_size=12),
       st.lists(st.tuples(_KEY, _QVALUE), min_size=1, max_size=5),
       st.sampled_from(["https://acct.blob.core.windows.net/c/nccl.log", "s3://b/k", "/tmp/f", ""]))
def test_every_query_string_value_is_dropped(marker, pairs, base) -> None:
    values = [f"Q{marker}{i}{v}" for i, (_, v) in enumerate(pairs)]
    url = base + "?" + "&".join(f"{k}={v}" for (k, _), v in zip(pairs, values))
    out = redact_value(url)
    for v in values:
        assert v not in out
    for k, _ in pairs:
        assert f"{k}={REDACTED}" in out          # the key still says what it was


@given(st.text(string.ascii_letters + string.digits + "-_.~%=&", min_size=1, max_size=40))
def test_url_fragments_are_dropped(fragment) -> None:
    for url in (f"https://h/p#{fragment}", f"s3://b/k?x=1#{fragment}"):
        out = redact_value(url)
        assert out.endswith("#" + REDACTED), out


@given(_TOKEN, _CONTEXT)
def test_a_random_run_is_redacted_wherever_it_sits(token, context) -> None:
    """Judged random on its own: embedded in any value, it never leaves."""
    assume(looks_random(token))
    out = redact_value(context.format(token))
    assert token not in out and REDACTED in out


def test_real_random_tokens_are_judged_random() -> None:
    """base64/base64url/hex of 18-48 random bytes: what API keys and SAS signatures are."""
    rng = random.Random(1234)
    encoders = (base64.b64encode, base64.urlsafe_b64encode, lambda b: b.hex().encode())
    missed = 0
    for i in range(6000):
        raw = bytes(rng.getrandbits(8) for _ in range(rng.randint(18, 48)))
        token = encoders[i % 3](raw).decode()
        out = redact_value(f"/scratch/run/{token}/nccl.log")
        missed += token in out
    # The shape heuristic misses ~0.5% of short base64 tokens that happen to
    # spell words; the token patterns and the name rule do not depend on it.
    assert missed / 6000 < 0.01, f"{missed} random tokens kept"


@given(st.lists(st.tuples(_WORDS, st.sampled_from(["", "_", "-", "2024", "0", "12000"])),
                min_size=1, max_size=6))
def test_paths_made_of_words_stay_readable(parts) -> None:
    path = "/" + "/".join(w + s for w, s in parts) + "/model-00001-of-00004.safetensors"
    assert redact_value(path) == path


@given(st.text(max_size=80))
def test_redaction_is_idempotent_and_never_longer_than_needed(value) -> None:
    once = redact_value(value)
    assert redact_value(once) == once


def test_job_ids_lose_url_data_but_keep_random_looking_run_ids() -> None:
    assert redact_patterns("etcd://h:2379/run?token=Ab9&sig=Zz1") == \
        f"etcd://h:2379/run?token={REDACTED}&sig={REDACTED}"
    run_id = "Xk3jQ9vLm2Np8Rt5Wz7Yb4Hc6Df1Gs0A"
    assert redact_patterns(run_id) == run_id and redact_value(run_id) == REDACTED


@pytest.mark.parametrize("value,secret", [
    ("https://acct.blob.core.windows.net/logs/nccl.log?sv=2021-08-06&sig=Hx8f3K2LmQ9pR%2F", "Hx8f3K2"),
    ("/mnt/checkpoints/experiments/Hx8f3K2LmQ9pR7vT1wYzA4bC6dE0gFiJ/model.pt", "Hx8f3K2LmQ9p"),
    ("/tmp/run-0123456789abcdef0123456789abcdef01234567/nccl.log", "0123456789abcdef0123"),
    ("gs://b/o?X-Goog-Signature=9f8e7d6c5b4a39281706f5e4d3c2b1a0", "9f8e7d6c5b4a"),
    ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "bPxRfiCYEXAMPLEKEY"),
])
def test_embedded_credentials_are_redacted(value, secret) -> None:
    out = redact_value(value)
    assert secret not in out and REDACTED in out
@pytest.mark.parametrize("env", [
    {"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"},
    {"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"},
])
def test_a_bad_rank_is_an_unknown_member_never_a_number(env) -> None:
    ident = identify(env, "n")
    assert ident is not None and not ident.known and ident.rank_source == "unknown"
