"""``ncclwatch dump`` writes where the operator said, never where the answer says:
against a real HTTP server that names hostile files, redirects to another
origin, or finds a symlink planted at the output path."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ncclwatch.cli import main

BODY = b"\x1f\x8b not really a bundle, only bytes to find again"
GOOD = "ncclwatch-dump-job-1-20250101T000000Z.tar.gz"
MADE = re.compile(r"ncclwatch-dump-job-1-\d{8}T\d{6}Z\.tar\.gz")


class Server:
    """A daemon stand-in: answers every dump with ``name`` in Content-Disposition,
    or, with ``redirect`` set, that status code and Location instead."""

    def __init__(self) -> None:
        self.name = GOOD
        self.redirect: tuple[int, str] | None = None
        self.hits: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self) -> None:
                server.hits.append(f"{self.command} {self.path}")
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if server.redirect and not self.path.startswith("/moved"):
                    code, where = server.redirect
                    self.send_response(code)
                    self.send_header("Location", where)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/gzip")
                self.send_header("Content-Disposition", f'attachment; filename="{server.name}"')
                self.send_header("Content-Length", str(len(BODY)))
                self.end_headers()
                self.wfile.write(BODY)

            do_GET = do_POST = answer

            def log_message(self, *a) -> None:  # noqa: ANN002
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def daemon() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


@pytest.fixture
def other() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


def dump(srv: Server, *extra: str, wait: str = "0") -> int:
    return main(["dump", "job-1", "--daemon", srv.url, "--wait", wait, *extra])


@pytest.mark.parametrize("hostile", [
    ".bashrc", "..", ".hidden.tar.gz", "../../escape.tar.gz", "x/../../y.tar.gz",
    "/etc/cron.d/x.tar.gz", "evil.sh", "a" * 129 + ".tar.gz", "",
])
def test_a_file_name_outside_the_grammar_is_never_used(daemon, tmp_path, capsys,
                                                       hostile) -> None:
    out = tmp_path / "out"
    out.mkdir()
    daemon.name = hostile
    assert dump(daemon, "--out", str(out)) == 0, capsys.readouterr().err
    [got] = list(out.iterdir())
    assert MADE.fullmatch(got.name), got.name
    assert got.read_bytes() == BODY and got.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_the_daemons_own_name_is_kept_and_the_default_folder_is_the_current_one(
        daemon, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert dump(daemon, wait="1") == 0
    assert (tmp_path / GOOD).read_bytes() == BODY
    assert f"ncclwatch diagnose {GOOD}" in capsys.readouterr().out
    assert daemon.hits[0].startswith("POST /api/v1/dump?job=job-1")


@pytest.mark.parametrize("wait,code", [("0", 302), ("1", 303), ("0", 307), ("0", 301)])
def test_a_redirect_to_another_origin_is_refused(daemon, other, tmp_path, capsys,
                                                 wait, code) -> None:
    """The other origin answers ``.bashrc``: it is never asked, nothing is written."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("mine\n")
    other.name = ".bashrc"
    daemon.redirect = (code, f"{other.url}/moved")
    assert dump(daemon, "--out", str(home), wait=wait) == 1
    err = capsys.readouterr().err
    assert "redirect to another origin refused" in err and other.url in err, err
    assert other.hits == []
    assert sorted(p.name for p in home.iterdir()) == [".bashrc"]
    assert (home / ".bashrc").read_text() == "mine\n"


def test_a_redirect_within_the_daemons_origin_is_followed(daemon, tmp_path) -> None:
    daemon.redirect = (302, "/moved/api/v1/dump?job=job-1")
    assert dump(daemon, "--out", str(tmp_path)) == 0
    assert (tmp_path / GOOD).read_bytes() == BODY
    assert [h.split("?")[0] for h in daemon.hits] == ["GET /api/v1/dump", "GET /moved/api/v1/dump"]


@pytest.mark.parametrize("dangling", [False, True])
def test_a_symlink_at_the_output_path_is_not_followed(daemon, tmp_path, capsys,
                                                      dangling) -> None:
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    victim = elsewhere / "victim"
    if not dangling:
        victim.write_text("the job user's file\n")
    (out / GOOD).symlink_to(victim)
    assert dump(daemon, "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert f"{out / GOOD} exists (a symlink): not overwritten" in err, err
    assert (out / GOOD).is_symlink()
    if dangling:
        assert not victim.exists()
    else:
        assert victim.read_text() == "the job user's file\n"


def test_out_is_never_followed_through_a_symlink_nor_overwritten(daemon, tmp_path,
                                                                 capsys) -> None:
    """``--out`` is the operator's path: still not a symlink (to a file or a folder),
    and an existing file there is theirs to move, not ours to replace."""
    real = tmp_path / "real"
    real.mkdir()
    kept = tmp_path / "kept.tar.gz"
    kept.write_text("an older bundle\n")
    for name, target in (("to-dir", real), ("to-file", kept), ("dangling", tmp_path / "none")):
        link = tmp_path / name
        link.symlink_to(target)
        assert dump(daemon, "--out", str(link)) == 2
        assert f"{link} is a symlink: not followed" in capsys.readouterr().err
    assert list(real.iterdir()) == [] and not (tmp_path / "none").exists()
    assert dump(daemon, "--out", str(kept)) == 2
    assert "exists (a file): not overwritten" in capsys.readouterr().err
    assert kept.read_text() == "an older bundle\n"
    # A new file name of the operator's is theirs, as given.
    assert dump(daemon, "--out", str(tmp_path / "mine.tgz")) == 0
    assert (tmp_path / "mine.tgz").read_bytes() == BODY
    assert os.stat(tmp_path / "mine.tgz").st_mode & 0o777 == 0o600
