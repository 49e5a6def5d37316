# Command line contract: a bad option exits 2 with exactly one line on stderr naming the option, --help and
# --version exit 0, and SIGINT/SIGTERM end a running tap with exit 0.

import os
import signal
import subprocess

from tapharness import AMQPTAP_BIN, Tap, TapTestCase, free_port, main


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

    def test_help(self):
        r = run("--help")
        self.assertEqual(r.returncode, 0)
        out = r.stdout.decode()
        for opt in ("--listen", "--upstream", "--verdicts", "--frames"):
            self.assertIn(opt, out)

    def test_version(self):
        r = run("--version")
        self.assertEqual(r.returncode, 0)
        self.assertRegex(r.stdout.decode(), r"amqptap.*\d+\.\d+\.\d+")

    def test_signals_exit_zero(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            tap = Tap(free_port())
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


if __name__ == "__main__":
    main()
