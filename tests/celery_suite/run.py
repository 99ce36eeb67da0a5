"""Run Celery's own integration tests with celery_aitp in each stage, next to plain Celery.

    python -m tests.celery_suite.run [--stages plain,coexistence,split,takeover]
        [--broker redis|rabbitmq] [--modules test_canvas.py,test_tasks.py] [-k EXPR]

The tests are the ``t/integration`` modules of the source distribution of the Celery
version installed, fetched once with ``pip download celery==<version> --no-deps
--no-binary :all:`` into ``AITP_CELERY_SUITE_CACHE`` (default ``.celery-suite/`` in the
repository, ignored by git). Each stage runs in its own pytest process with
``tests/celery_suite/plugin.py`` (which says what it changes and why) and its own private
redis-server as broker and result backend: Celery's tests use fixed Redis keys and count
the server's pub/sub channels, so stages, and other users of a shared server, must not
meet. Stages run in parallel on Redis (the tests mostly wait on the worker); on RabbitMQ
(``AITP_TEST_AMQP_URL``'s vhost, one at a time) the broker is RabbitMQ and the result
backend the private Redis.

Prints, per stage, the counts (passed, failed, skipped, errors), the deliveries the
suite's worker received through tier queues, and every test whose outcome differs from
plain Celery's; a test that differs is run again in both, twice at most, and only a
difference that repeats counts (``confirm_differences``). Exits 1 if one does, or if
fewer than half of the takeover deliveries went through tier queues. Tests plain Celery
also fails or skips are listed apart. ``AITP_SUITE_KEEP_LOGS=1`` keeps each stage's
pytest output (its directory is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("plain", "coexistence", "split", "takeover")
MODULES = ("test_canvas.py", "test_tasks.py")
#: Tests left out of a broker's run, in plain Celery and every stage alike, each for a
#: difference celery_aitp documents (docs/guarantees.md, "Compatibility with Celery").
KNOWN_DIFFERENCES = {
    "rabbitmq": {
        "test_expired": "a strict AITP worker reserves one task per process (prefetch 1, "
                        "acks_late), so the task published with expires=1 behind four "
                        "2-second tasks waits in RabbitMQ, which drops it at its expiry "
                        "(Celery sets the message TTL): its result stays PENDING and the "
                        "test's get() never returns; a plain worker reserves it at once "
                        "and revokes it",
    },
}
#: Both sides get the same reruns, so a test that fails once under load (Celery's suite
#: has timing-sensitive tests) does not count as a difference.
RERUNS = ("--reruns", "2", "--reruns-delay", "1")


def celery_version() -> str:
    import celery

    return str(celery.__version__)


def fetch_suite(cache: Path, version: str) -> Path:
    """The tests of Celery ``version``'s source distribution (downloaded once), unpacked
    without the ``celery`` package beside them: pytest puts their root on ``sys.path``,
    where that copy would shadow the installed Celery, which is the one to test."""
    tree = cache / f"celery-{version}-tests"
    if (tree / "t" / "integration" / "conftest.py").exists():
        return tree
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / f"celery-{version}.tar.gz"
    if not archive.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", f"celery=={version}",
                        "--no-deps", "--no-binary", ":all:", "--disable-pip-version-check",
                        "-q", "-d", str(cache)], check=True)
    top = f"celery-{version}/"
    with tarfile.open(archive) as tar:
        wanted = [m for m in tar.getmembers()
                  if m.name.startswith(top + "t/") or m.name == top + "pyproject.toml"]
        for member in wanted:
            member.name = member.name[len(top):]
        tar.extractall(tree, members=wanted, filter="data")
    return tree


def stage_command(tree: Path, targets: list[str], keyword: str | None) -> list[str]:
    """pytest on ``targets`` (test files or test ids, relative to the unpacked sdist)."""
    cmd = [sys.executable, "-m", "pytest", "-p", "celery.contrib.pytest",
           "-p", "tests.celery_suite.plugin", "-p", "no:cacheprovider",
           "--rootdir", str(tree), "-c", str(tree / "pyproject.toml"),
           "-q", "-rfEs", "--timeout", "300", *RERUNS, *[str(tree / t) for t in targets]]
    if keyword:
        cmd += ["-k", keyword]
    return cmd


def stage_env(stage: str, broker_url: str, redis_port: int, report: Path) -> dict[str, str]:
    backend = f"redis://127.0.0.1:{redis_port}/0"
    return dict(
        os.environ,
        TEST_BROKER=broker_url, TEST_BACKEND=backend,
        REDIS_HOST="127.0.0.1", REDIS_PORT=str(redis_port),
        AITP_SUITE_STAGE=stage, AITP_SUITE_REPORT=str(report),
        AITP_SUITE_PREFIX=f"aitp-suite-{stage}",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )


def differences(results: dict[str, dict[str, Any]], stage: str) -> list[str]:
    """Tests whose outcome in ``stage`` is not plain Celery's."""
    plain, got = results["plain"]["outcomes"], results[stage]["outcomes"]
    return sorted(t for t in set(plain) | set(got) if got.get(t) != plain.get(t))


def summarize(results: dict[str, dict[str, Any]]) -> tuple[str, bool]:
    """The comparison table and whether every stage matches plain Celery."""
    plain = results["plain"]["outcomes"]
    lines = [f"{'stage':<12} {'passed':>6} {'failed':>6} {'skipped':>7} {'errors':>6} "
             f"{'tier deliveries':>20}  differences from plain"]
    ok = True
    for stage, result in results.items():
        counts = Counter(result["outcomes"].values())
        got = result["deliveries"]
        tier, total = got.get("tier", 0), got.get("tier", 0) + got.get("other", 0)
        diff = differences(results, stage)
        lines.append(f"{stage:<12} {counts['passed']:>6} {counts['failed']:>6} "
                     f"{counts['skipped']:>7} {counts['error']:>6} {tier:>9} of {total:<8}  "
                     f"{len(diff)}")
        lines += [f"    {t}: plain {plain.get(t)}, {stage} {result['outcomes'].get(t)}"
                  for t in diff]
        if diff or (stage == "takeover" and tier * 2 <= total):
            ok = False
    not_passing = sorted(t for t, o in plain.items() if o != "passed")
    lines.append(f"plain Celery itself does not pass {len(not_passing)}:")
    lines += [f"    {t}: {plain[t]}" for t in not_passing]
    confirmed = sorted({t for r in results.values() for t in r.get("confirmed", ())})
    if confirmed:
        lines.append(f"run again to confirm a difference ({len(confirmed)}; the outcomes "
                     "above are the last runs'):")
        lines += [f"    {t}" for t in confirmed]
    return "\n".join(lines), ok


def confirm_differences(results: dict[str, dict[str, Any]], run: Any,
                        attempts: int = 2) -> None:
    """Run each test that differs from plain Celery again, in every stage, up to
    ``attempts`` times; a difference that does not repeat was the load on the machine
    (Celery's suite has timing-sensitive tests), not celery_aitp. The last run's
    outcomes replace the first's; deliveries stay the first run's."""
    stages = list(results)
    for _ in range(attempts):
        tests = sorted({t for s in stages[1:] for t in differences(results, s)})
        if not tests:
            return
        again = run(stages, tests)
        for stage in stages:
            results[stage]["outcomes"].update(again[stage]["outcomes"])
            results[stage].setdefault("confirmed", []).extend(tests)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--broker", choices=("redis", "rabbitmq"), default="redis")
    parser.add_argument("--modules", default=",".join(MODULES))
    parser.add_argument("-k", dest="keyword", default=None)
    parser.add_argument("--redis-port", type=int, default=20261,
                        help="first port to try for the private redis-servers")
    args = parser.parse_args(argv)
    stages = [s for s in args.stages.split(",") if s]
    if stages[0] != "plain":
        parser.error("--stages must start with plain (the reference)")
    cache = Path(os.environ.get("AITP_CELERY_SUITE_CACHE", ROOT / ".celery-suite"))
    tree = fetch_suite(cache, celery_version())
    modules = [m for m in args.modules.split(",") if m]
    targets = [f"t/integration/{m}" for m in modules]
    keyword = with_known_differences_left_out(args.keyword, args.broker)
    results = run_stages(tree, stages, targets, keyword, args.broker, args.redis_port)
    confirm_differences(results, lambda again, tests: run_stages(
        tree, again, tests, None, args.broker, args.redis_port))
    table, ok = summarize(results)
    for test, why in KNOWN_DIFFERENCES.get(args.broker, {}).items():
        print(f"left out on {args.broker}: {test}: {why}")
    print(f"Celery {celery_version()} integration suite ({', '.join(modules)}"
          f"{', -k ' + args.keyword if args.keyword else ''}) on {args.broker}, "
          f"testing the Celery in {Path(results['plain'].get('celery', '?')).parent}:")
    print(table)
    return 0 if ok else 1


def with_known_differences_left_out(keyword: str | None, broker: str) -> str | None:
    """The ``-k`` expression, minus the broker's known differences."""
    known = " or ".join(KNOWN_DIFFERENCES.get(broker, {}))
    if not known:
        return keyword
    return f"({keyword}) and not ({known})" if keyword else f"not ({known})"


def run_stages(tree: Path, stages: list[str], targets: list[str], keyword: str | None,
               broker: str, first_port: int) -> dict[str, dict[str, Any]]:
    """Run ``targets`` once per stage (in parallel on Redis); each stage's report."""
    from tests.support.faults import PrivateRedis

    workdir = Path(tempfile.mkdtemp(prefix="aitp-celery-suite-"))
    if os.environ.get("AITP_SUITE_KEEP_LOGS"):
        print(f"stage logs and reports: {workdir}")
    servers: list[PrivateRedis] = []
    results: dict[str, dict[str, Any]] = {}
    try:
        parallel = broker == "redis"
        batches = [stages] if parallel else [[s] for s in stages]
        for batch in batches:
            running = []
            for stage in batch:
                server = PrivateRedis(first_port + len(servers), durable=False).start()
                servers.append(server)
                broker_url = server.url if broker == "redis" else amqp_url()
                report = workdir / f"{stage}.json"
                log = open(workdir / f"{stage}.log", "wb")  # noqa: SIM115 - closed below
                proc = subprocess.Popen(
                    stage_command(tree, targets, keyword),
                    env=stage_env(stage, broker_url, server.port, report), cwd=str(tree),
                    stdout=log, stderr=subprocess.STDOUT)
                running.append((stage, proc, log, report))
            for stage, proc, log, report in running:
                proc.wait()
                log.close()
                tail = (workdir / f"{stage}.log").read_text(errors="replace")
                print(f"--- {stage} (exit {proc.returncode}): "
                      f"{tail.strip().splitlines()[-1] if tail.strip() else 'no output'}")
                if not report.exists():
                    print(tail[-5000:])
                    raise SystemExit(f"stage {stage} wrote no report")
                results[stage] = json.loads(report.read_text())
            if broker == "rabbitmq":
                clean_vhost()
    finally:
        for server in servers:
            server.close()
        if not os.environ.get("AITP_SUITE_KEEP_LOGS"):  # set it to read the logs afterwards
            shutil.rmtree(workdir, ignore_errors=True)
    return results


def amqp_url() -> str:
    """The RabbitMQ vhost to run in: the test suite's (``AITP_TEST_AMQP_URL``)."""
    from tests.support.services import DEFAULT_AMQP

    return os.environ.get("AITP_TEST_AMQP_URL", DEFAULT_AMQP)


def clean_vhost() -> None:
    """Delete the queues a stage left in the test vhost (Celery's and the tier queues)."""
    from celery_aitp.policy import load_policy
    from tests.celery_suite.plugin import suite_policy
    from tests.support.rabbit import delete_queues

    policy = load_policy(suite_policy("takeover"))
    tiers = [f"aitp.{t}.{a}" for t in policy.tenants for a in policy.accelerators]
    delete_queues(amqp_url(), ["celery", *tiers])


if __name__ == "__main__":
    sys.exit(main())
