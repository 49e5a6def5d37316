# Command line contract: a bad option exits 2 with exactly one line on stderr naming the option, --help and
# --version exit 0, and SIGINT/SIGTERM end a running tap with exit 0. The getopt_long forms (--opt=value,
# bundles, --), -q/-v on a real session through the tap, and the man page and completion the build generated
# listing exactly the options of --help.

import os
import re
import shutil
import signal
import subprocess
import tempfile
import uuid

import pika

from tapharness import (AMQPTAP_BIN, BROKER_PORT, SOURCE_DIR, Tap, TapTestCase, capture_port, free_port, main,
                        read_records, replay, require_broker, wait_for)


def run(*args, timeout=10):
    return subprocess.run([AMQPTAP_BIN, *args], stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                          env=dict(os.environ, ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "detect_leaks=1")))


class CliTest(TapTestCase):
    def assert_usage_error(self, args, option):
        # A free upstream port and listen port, so a tap that wrongly starts cannot disturb anything.
        base = []
        if "--listen" not in args:
            base += ["--listen", f"127.0.0.1:{free_port()}"]
        if "--upstream" not in args:
            base += ["--upstream", f"127.0.0.1:{free_port()}"]
        try:
            r = run(*base, *args, timeout=5)
        except subprocess.TimeoutExpired:
            self.fail(f"amqptap {' '.join(args)}: still running after 5 s instead of exiting 2")
        err = r.stderr.decode("utf-8", "replace")
        lines = [line for line in err.splitlines() if line.strip()]
        self.assertEqual(r.returncode, 2, f"{args}: exit {r.returncode}, stderr {err!r}")
        self.assertEqual(len(lines), 1, f"{args}: want exactly one line on stderr, got {err!r}")
        self.assertIn(option, lines[0], f"{args}: the message does not name {option}")
        self.assertEqual(r.stdout, b"", f"{args}: nothing belongs on stdout")

    def test_listen_nonsense(self):
        self.assert_usage_error(["--listen", "nonsense"], "--listen")

    def test_listen_port_out_of_range(self):
        self.assert_usage_error(["--listen", "127.0.0.1:70000"], "--listen")

    def test_listen_port_not_a_number(self):
        self.assert_usage_error(["--listen", "127.0.0.1:56x"], "--listen")

    def test_upstream_empty_host_port_zero(self):
        self.assert_usage_error(["--upstream", ":0"], "--upstream")

    def test_upstream_no_port(self):
        self.assert_usage_error(["--upstream", "localhost"], "--upstream")

    def test_metrics_host_that_does_not_exist(self):
        self.assert_usage_error(["--metrics", "no-such-host.invalid:0"], "--metrics")

    def test_unknown_flag(self):
        self.assert_usage_error(["--bogus-flag"], "--bogus-flag")

    def test_negative_return_window(self):
        self.assert_usage_error(["--return-window", "-5"], "--return-window")

    def test_missing_value(self):
        self.assert_usage_error(["--verdicts"], "--verdicts")
        self.assert_usage_error(["--upstream", f"127.0.0.1:{free_port()}", "--listen"], "--listen")

    def test_negative_body_bytes(self):
        self.assert_usage_error(["--body-bytes", "-1"], "--body-bytes")

    def test_missing_value_last_option(self):
        self.assert_usage_error(["--frames"], "--frames")
        self.assert_usage_error(["--return-window"], "--return-window")

    def test_equals_form_errors(self):
        self.assert_usage_error(["--listen=127.0.0.1:70000"], "--listen")
        self.assert_usage_error(["--return-window="], "--return-window")
        self.assert_usage_error(["--quiet=yes"], "--quiet")
        self.assert_usage_error(["--bogus=1"], "--bogus")

    def test_bundle_errors(self):
        self.assert_usage_error(["-vz"], "-z")
        self.assert_usage_error(["-qo"], "--verdicts")

    def test_abbreviations_refused(self):
        self.assert_usage_error(["--verb"], "--verb")
        self.assert_usage_error(["--upstream-c", "x.pem"], "--upstream-c")

    def test_double_dash_ends_options(self):
        self.assert_usage_error(["--", "--verbose"], "--verbose")
        self.assert_usage_error(["-v", "--", "stray"], "stray")

    def test_tap_id_checked(self):
        self.assert_usage_error(["--tap-id", "two words"], "--tap-id")
        self.assert_usage_error(["--tap-id="], "--tap-id")

    def test_help(self):
        r = run("--help")
        self.assertEqual(r.returncode, 0)
        out = r.stdout.decode()
        for opt in ("--listen", "--upstream", "--verdicts", "--frames"):
            self.assertIn(opt, out)

    def test_version(self):
        for flag in ("--version", "-V"):
            r = run(flag)
            self.assertEqual(r.returncode, 0)
            lines = r.stdout.decode().splitlines()
            self.assertEqual(len(lines), 4, lines)
            m = re.fullmatch(r"amqptap \d+\.\d+\.\d+ \(git ([0-9a-f]{12}(-dirty)?|unknown)\)", lines[0])
            self.assertIsNotNone(m, lines[0])
            if os.path.exists(os.path.join(SOURCE_DIR, ".git")):
                self.assertNotEqual(m.group(1), "unknown", "built from a git checkout: the revision is known")
            self.assertRegex(lines[1], r"^libevent \d+\.\d+\.\d+\S* \(compiled with \d+\.\d+\.\d+\S*\)$")
            self.assertRegex(lines[2], r"^OpenSSL \d+\.\d+\.\d+.* \(compiled with OpenSSL \d+\.\d+\.\d+.*\)$")
            self.assertRegex(lines[3], r"^libpcap version \d+\.\d+\.\d+")

    def test_signals_exit_zero(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            tap = Tap.proxy(free_port())
            try:
                self.assertTrue(tap.alive())
                rc = tap.stop(sig)
                self.assertEqual(rc, 0, f"exit {rc} after {sig.name}: {tap.stderr()!r}")
            finally:
                tap.cleanup()

    def test_listen_port_in_use(self):
        tap = self.start_tap(upstream_port=free_port())
        r = run("--listen", f"127.0.0.1:{tap.port}", "--upstream", f"127.0.0.1:{free_port()}", timeout=5)
        self.assertNotEqual(r.returncode, 0, "a second tap on a busy port must fail")
        self.assertIn(str(tap.port), r.stderr.decode("utf-8", "replace"))

    def test_upstream_name_that_cannot_be_resolved_for_now_exits_1(self):
        """A name server that does not answer (the network not up yet at boot) is a failure for now: exit 1, which
        the systemd unit's Restart=on-failure retries; exit 2 (RestartPreventExitStatus) would leave the service
        failed for good. Run with /etc/resolv.conf pointing at a port nothing answers on, in a mount namespace of
        its own; skipped where one cannot be made."""
        dead = os.path.join(tempfile.mkdtemp(prefix="amqptap-dns-"), "resolv.conf")
        self.addCleanup(shutil.rmtree, os.path.dirname(dead), True)
        with open(dead, "w") as f:
            f.write("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        name = f"amqptap-no-such-host-{uuid.uuid4().hex[:8]}.example"
        cmd = (f"mount --bind {dead} /etc/resolv.conf && exec {AMQPTAP_BIN} --listen 127.0.0.1:{free_port()} "
               f"--upstream {name}:5672")
        r = subprocess.run(["unshare", "--mount", "sh", "-c", cmd], capture_output=True, timeout=30)
        err = r.stderr.decode()
        if "unshare" in err or "mount:" in err:
            self.skipTest(f"no mount namespace here: {err.strip()}")
        self.assertEqual(r.returncode, 1, err)
        self.assertEqual(err.strip().splitlines(), [f"amqptap: --upstream: cannot resolve '{name}': Temporary failure "
                                                    "in name resolution (for now: exit 1, so that a service manager "
                                                    "starts the tap again)"])

    def test_upstream_name_that_does_not_exist_exits_2(self):
        """A name the name server says does not exist is a mistake in the configuration: exit 2."""
        r = run("--listen", f"127.0.0.1:{free_port()}", "--upstream", "no-such-host.invalid:5672", timeout=30)
        err = r.stderr.decode()
        if "Temporary failure" in err:
            self.skipTest("no name server answers here")
        self.assertEqual(r.returncode, 2, err)
        self.assertIn("--upstream: cannot resolve 'no-such-host.invalid'", err)


def help_options(text):
    """The option names ("--listen", "-l") of --help."""
    names = set()
    for m in re.finditer(r"^  (?:(-\w), )?(--[\w-]+)", text, re.M):
        names.update(n for n in m.groups() if n)
    return names


def man_options(roff):
    """The option names of the OPTIONS entries (".TP" then the names in bold) of a man page."""
    names = set()
    options = roff.split(".SH OPTIONS\n", 1)[1].split(".SH ", 1)[0]
    for entry in options.split(".TP\n")[1:]:
        first = entry.split("\n", 1)[0]
        names.update(n.replace("\\-", "-") for n in re.findall(r"\\fB(.*?)\\fR", first))
    return names


def completion_options(script):
    """The words the bash completion offers after a dash, without the trailing "=" of options with values."""
    words = re.search(r"compgen -W '(-[^']*)'", script).group(1).split()
    return {w.rstrip("=") for w in words}


class GeneratedDocsTest(TapTestCase):
    """The build writes the man page and the completion from the option table (tap_gendoc): both list exactly
    the options that --help lists."""

    def test_man_and_completion_match_help(self):
        gen = os.path.join(os.path.dirname(AMQPTAP_BIN), "gen")
        if not os.path.exists(os.path.join(gen, "amqptap.1")):
            self.skipTest(f"no generated docs beside {AMQPTAP_BIN}")
        want = help_options(run("--help").stdout.decode())
        self.assertIn("--tap-id", want)
        self.assertIn("-q", want)
        self.assertGreater(len(want), 30)
        with open(os.path.join(gen, "amqptap.1")) as f:
            self.assertEqual(man_options(f.read()), want)
        with open(os.path.join(gen, "amqptap.bash")) as f:
            self.assertEqual(completion_options(f.read()), want)

    def complete(self, *words):
        """What the generated completion offers for the last of words (bash-completion loaded), run in a directory
        that holds one file."""
        script = os.path.join(os.path.dirname(AMQPTAP_BIN), "gen", "amqptap.bash")
        lib = "/usr/share/bash-completion/bash_completion"
        if not os.path.exists(script) or not os.path.exists(lib):
            self.skipTest("no generated completion or no bash-completion here")
        d = tempfile.mkdtemp(prefix="amqptap-complete-")
        self.addCleanup(shutil.rmtree, d, True)
        open(os.path.join(d, "somefile"), "w").close()
        line = " ".join(words)
        quoted = " ".join(f"'{w}'" for w in words)
        cmd = (f"source {lib}; source {script}; COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; "
               f"COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}}; _amqptap; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
        r = subprocess.run(["bash", "-c", cmd], cwd=d, capture_output=True, text=True, timeout=30)
        return set(r.stdout.split())

    def test_completion_offers_interfaces_and_files_where_they_go(self):
        self.assertIn("lo", self.complete("amqptap", "sniff", "--interface", ""))
        self.assertNotIn("somefile", self.complete("amqptap", "sniff", "--interface", ""))
        self.assertIn("somefile", self.complete("amqptap", "--verdicts", ""))
        self.assertEqual(self.complete("amqptap", "--tap-id", ""), set())


def listening(port):
    """True when something listens on 127.0.0.1:port (read from /proc: no probe connection for the tap to log)."""
    needle = f"0100007F:{port:04X}"
    with open("/proc/net/tcp") as f:
        return any(line.split()[1] == needle and line.split()[3] == "0A" for line in f.readlines()[1:])


class VerbosityTest(TapTestCase):
    """-q, -v and the default on a real confirmed publish through the tap, started with getopt_long forms."""

    def setUp(self):
        super().setUp()
        require_broker(self)
        self.dir = tempfile.mkdtemp(prefix="amqptap-cli-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)
        super().tearDown()

    def session(self, *flags):
        """Runs the tap with flags, publishes one confirmed mandatory message through it, stops it with SIGTERM;
        returns (stderr, records)."""
        port = free_port()
        verdicts = os.path.join(self.dir, f"v-{uuid.uuid4().hex[:6]}.jsonl")
        err_path = verdicts + ".err"
        args = [AMQPTAP_BIN, *[f.format(verdicts=verdicts, port=port, broker=BROKER_PORT) for f in flags]]
        with open(err_path, "wb") as err:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        try:
            self.assertTrue(wait_for(lambda: proc.poll() is not None or listening(port), 10), "tap never listened")
            self.assertIsNone(proc.poll(), f"tap exited {proc.returncode}")
            conn = pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=port,
                                                                     connection_attempts=1, socket_timeout=10))
            queue = f"amqptap-it-cli-{uuid.uuid4().hex[:8]}"
            ch = conn.channel()
            ch.queue_declare(queue, auto_delete=True)
            ch.confirm_delivery()
            ch.basic_publish("", queue, b"one", mandatory=True)
            ch.queue_delete(queue)
            conn.close()
            proc.send_signal(signal.SIGTERM)
            self.assertEqual(proc.wait(15), 0)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        with open(err_path, "rb") as f:
            stderr = f.read().decode("utf-8", "replace")
        pubs = [r for r in read_records(verdicts) if r.get("type") == "publish"]
        self.assertEqual([(r["route"], r["confirm"]) for r in pubs], [("routed", "ack")], stderr)
        return stderr

    def test_verbose_bundled_with_a_value_and_equals_forms(self):
        err = self.session("-vo", "{verdicts}", "--listen=127.0.0.1:{port}", "--upstream=127.0.0.1:{broker}",
                           "--tap-id=cli-test")
        self.assertIn("listening on", err)
        opened = re.search(r"amqptap: conn (\d+) from 127\.0\.0\.1:\d+ to 127\.0\.0\.1:%d\n" % BROKER_PORT, err)
        self.assertTrue(opened, err)
        self.assertIn(f"amqptap: conn {opened.group(1)} closed: client_eof", err)  # the same connection
        # the tap's own end towards the broker, what the broker lists as the client (upstream_local)
        self.assertRegex(err, r"amqptap: conn %s connected to the broker from 127\.0\.0\.1:\d+\n" % opened.group(1))

    def test_quiet_writes_nothing_but_records(self):
        err = self.session("-qo{verdicts}", "-l", "127.0.0.1:{port}", "-u", "127.0.0.1:{broker}")
        self.assertEqual(err, "")

    def test_later_flag_wins_in_a_bundle(self):
        err = self.session("-vq", "--verdicts", "{verdicts}", "--listen", "127.0.0.1:{port}", "--upstream",
                           "127.0.0.1:{broker}")
        self.assertEqual(err, "")
        err = self.session("-qv", "--verdicts", "{verdicts}", "--listen", "127.0.0.1:{port}", "--upstream",
                           "127.0.0.1:{broker}")
        self.assertRegex(err, r"conn \d+ closed: ")

    def test_default_has_no_connection_lines(self):
        err = self.session("--verdicts", "{verdicts}", "--listen", "127.0.0.1:{port}", "--upstream",
                           "127.0.0.1:{broker}")
        self.assertIn("listening on", err)
        self.assertNotRegex(err, r"conn \d+ closed")
        self.assertNotRegex(err, r"conn \d+ from")


class ReplayDoubleDashTest(TapTestCase):
    """After "--" a capture whose name starts with a dash is the capture, not an option."""

    def test_capture_named_like_an_option(self):
        src = os.path.join(SOURCE_DIR, "captures", "confirm_mandatory.pcapng")
        port = capture_port(src)
        d = tempfile.mkdtemp(prefix="amqptap-cli-")
        try:
            shutil.copy(src, os.path.join(d, "-v.pcapng"))
            plain = replay(src, port, ["-q"], timeout=30)
            dashed = replay(None, extra_args=[f"--port={port}", "-q", "--", "-v.pcapng"], cwd=d, timeout=30)
        finally:
            shutil.rmtree(d, ignore_errors=True)
        self.assertEqual(plain.returncode, 0, plain.stderr())
        self.assertEqual(dashed.returncode, 0, dashed.stderr())
        self.assertIn(b'"type":"publish"', plain.output)
        self.assertEqual(dashed.output, plain.output)
        self.assertEqual(dashed.stderr(), "", "-q: no summary")

    def test_missing_capture(self):
        """A capture that cannot be opened: exit 1, one line naming it, and no other claim about it (the gap count
        was once read from memory the failed open never wrote)."""
        r = replay("/nonexistent/x.pcapng", 5672, ["-q"], timeout=30)
        self.assertEqual(r.returncode, 1, r.stderr())
        self.assertEqual(r.stderr(), "amqptap: replay /nonexistent/x.pcapng: No such file or directory\n")
        self.assertEqual(r.output, b"")
        d = tempfile.mkdtemp(prefix="amqptap-dir-")
        self.addCleanup(shutil.rmtree, d, True)
        r = replay(d, extra_args=["-q"], timeout=30)
        self.assertEqual((r.returncode, r.stderr()), (1, f"amqptap: replay {d}: Is a directory\n"))


if __name__ == "__main__":
    main()
