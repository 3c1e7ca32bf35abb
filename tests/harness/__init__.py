"""What the tests start and observe, in one package; test modules import from here
(and from the product and bench/), never from one another.

Each module is named for what it gives:

- ``paths``: the checkout, the venv's bin/, tests/data, tests/workloads, artifacts/.
- ``tools``: real tools a test needs (``need``, ``need_system``, promtool, setpriv...).
- ``procs``: child processes and their output, free ports, readiness.
- ``jobs``: a torch job's launcher and its ranks' marker lines.
- ``monitor``: a running ncclwatch from outside: HTTP, metrics, the jobs it shows.
- ``artifacts``: logs and measurements kept under artifacts/.
- ``reports``: reports as an agent sends them, and daemons fed them second by second.
- ``bundles``: a stalled daemon to pack an evidence bundle, and a bundle read back.
- ``daemons``: a daemon in this process on loopback (gRPC ``Harness``, HTTP ``serving``),
  and ``until``: wait in the test's event loop for what it shows.
- ``credentials``: certificates from ``ncclwatch certs``, the web config's password.
- ``trackers``: a rank as the agent's tracker and stack policy see it, round by round.
- ``alerting``: the shipped rules, Prometheus and Alertmanager, a webhook receiver.
- ``browser``: headless Chromium over the DevTools protocol.
- ``sdnotify``: the systemd end of sd_notify.
- ``slurm``: a real single-node Slurm cluster, the TaskProlog run as slurmstepd runs it.
- ``containerns``: containers made by the test (namespaces, chroot, pivot_root).
- ``kubelet``: pods of the rendered manifests started as a kubelet would.
- ``k8s``: the Kubernetes layout as tests read it: the CRDs' fields, objects by kind and
  name, its pods' certificates and web login, cert-manager's Secrets for its Certificates.
- ``throttlefs``: a bandwidth-limited FUSE mount.
- ``nsinit``: each xdist worker in its own pid namespace (``--ns-workers``), its init.
- ``release``: the runtime lock's pins per Python.
- ``statusview``: ``ncclwatch status`` on the view recorded from ``make demo``.
- ``shards``: job ids that land one per shard.
- ``fixcheck``: a remediation snippet checked with its framework's own code.
- ``scenarios``, ``launchers``, ``scenariorun``: the scenario matrix's rows, how each
  launcher starts a world, and running one row against a live ncclwatch.
- ``budgets``: each test's time budget (a pytest plugin, ``-p tests.harness.budgets``),
  and each session's times left in artifacts/.
- ``suitetimes``: BENCHMARKS.md's section on the suite, written from those times.
- ``corpus``: the diagnose corpus (tests/data/diagnose): its cases, the healthy ones, a
  case copied with lines put into its largest log.
- ``mangle``: what terminals and forums do to a log on its way into a paste (one table
  of transformations: the corpus's mangled twins and the diagnose property tests).
"""
