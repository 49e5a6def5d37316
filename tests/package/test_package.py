# The Debian package as an operator meets it: scripts/package.sh builds it, dpkg -i installs it on this
# machine, the installed /usr/bin/amqptap carries a real confirmed publish to the test broker (with the
# options of the shipped /etc/default/amqptap), man renders the installed man page, bash completes every
# option from the installed completion, systemd-analyze verify accepts both units, logrotate accepts its
# config, lintian finds no error in the .deb, and dpkg -r / dpkg -P remove it all, the links of enabled
# units included. Needs root (dpkg); installs man-db, systemd, bash-completion, dpkg-dev, file, logrotate,
# strace and lintian when missing. Run once per CI run: ctest -L package (about 45 s).

import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

import pika

from tapharness import BROKER_PORT, SOURCE_DIR, free_port, main, read_records, require_broker, wait_for

INSTALLED = "/usr/bin/amqptap"
MAN = "/usr/share/man/man1/amqptap.1.gz"
COMPLETION = "/usr/share/bash-completion/completions/amqptap"
UNIT_DIR = "/usr/lib/systemd/system"
UNITS = ("amqptap.service", "amqptap-sniff@.service")
DEFAULTS = "/etc/default/amqptap"
LOGROTATE = "/etc/logrotate.d/amqptap"
DOC = "/usr/share/doc/amqptap"
TOOLS = {"man": "man-db", "systemd-analyze": "systemd", "dpkg-shlibdeps": "dpkg-dev", "file": "file",
         "logrotate": "logrotate", "strace": "strace", "lintian": "lintian"}
# What `systemctl enable` makes for the units (README: `systemctl enable --now amqptap`, `amqptap-sniff@eth0`).
ENABLED = ("amqptap.service", "amqptap-sniff@eth0.service", "amqptap-sniff@lo.service")
SYSTEMD_DIRS = ("/etc/systemd", "/lib/systemd", "/usr/lib/systemd", "/run/systemd")


def sh(*args, check=True, timeout=300, **kw):
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"{shlex.join(args)}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def apt_install(packages):
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    lock = ["-o", "DPkg::Lock::Timeout=300"]
    sh("apt-get", *lock, "update", "-qq", env=env, timeout=600)
    sh("apt-get", *lock, "install", "-y", "-qq", "--no-install-recommends", *packages, env=env, timeout=600)


def dpkg(*args):
    """dpkg, waiting while another dpkg or apt holds the lock (other jobs on the machine may install things)."""
    end = time.monotonic() + 300
    while True:
        r = sh("dpkg", *args, check=False)
        if r.returncode == 0 or "lock" not in r.stderr or time.monotonic() > end:
            return r
        time.sleep(2)


def installed(package):
    r = sh("dpkg-query", "-W", "-f=${Status}", package, check=False)
    return r.returncode == 0 and "install ok installed" in r.stdout


def help_options(text):
    names = set()
    for m in re.finditer(r"^  (?:(-\w), )?(--[\w-]+)", text, re.M):
        names.update(n for n in m.groups() if n)
    return names


class PackageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("dpkg -i needs root")
        missing = sorted({pkg for tool, pkg in TOOLS.items() if not any(
            os.access(os.path.join(d, tool), os.X_OK) for d in os.environ.get("PATH", "").split(":") + ["/usr/sbin"])}
            | ({"bash-completion"} if not os.path.exists("/usr/share/bash-completion/bash_completion") else set()))
        if missing:
            apt_install(missing)
        if installed("amqptap"):
            print("amqptap was installed before the test: purging it first", file=sys.stderr)
            assert dpkg("-P", "amqptap").returncode == 0
        t0 = time.monotonic()
        r = sh(os.path.join(SOURCE_DIR, "scripts", "package.sh"), timeout=900)
        cls.deb = r.stdout.strip().splitlines()[-1]
        print(f"built {cls.deb} in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        r = dpkg("-i", cls.deb)
        assert r.returncode == 0, f"dpkg -i {cls.deb}: {r.stdout}{r.stderr}"
        cls.files = sh("dpkg", "-L", "amqptap").stdout.split()

    @classmethod
    def tearDownClass(cls):
        if os.geteuid() == 0 and installed("amqptap"):
            dpkg("-P", "amqptap")

    def test_1_contents_and_dependencies(self):
        for path in (INSTALLED, MAN, COMPLETION, DEFAULTS, LOGROTATE, *(os.path.join(UNIT_DIR, u) for u in UNITS)):
            self.assertIn(path, self.files)
            self.assertTrue(os.path.exists(path), path)
        fields = sh("dpkg-deb", "-f", self.deb, "Depends", "Version").stdout
        for lib in ("libc6", "libevent-2.1-7", "libssl3", "libpcap0.8"):
            self.assertIn(lib, fields, "Depends from dpkg-shlibdeps")
        conffiles = sh("dpkg-query", "-W", "-f=${Conffiles}", "amqptap").stdout
        self.assertIn(DEFAULTS, conffiles)
        self.assertIn(LOGROTATE, conffiles)
        self.assertNotIn(b"__asan_init", open(INSTALLED, "rb").read(), "the package is not a sanitizer build")

    def test_1_lintian(self):
        """lintian (Debian's package checker) finds no error, and the warnings and notes this package once had
        (no copyright file or changelog, description lines over 80 columns, systemctl in maintainer scripts,
        a .comment section) stay fixed. Its overrides, each with its reason: scripts/dist/deb/lintian-overrides."""
        r = sh("lintian", "--fail-on", "error", "--display-info", self.deb, check=False, timeout=600)
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out)
        self.assertNotRegex(out, r"(?m)^E: ")
        for tag in ("no-copyright-file", "no-changelog", "copyright-", "changelog-file", "dep5",
                    "extended-description-line-too-long", "maintainer-script-calls-systemctl",
                    "binary-has-unneeded-section"):
            self.assertNotRegex(out, rf"(?m)^[EWI]: amqptap: \S*{re.escape(tag)}", tag)

    def test_1_copyright_and_changelog(self):
        """The files every Debian package carries: a machine-readable copyright file (DEP-5) and the
        changelog, gzipped, whose entry is the package's version."""
        for path in (f"{DOC}/copyright", f"{DOC}/changelog.Debian.gz"):
            self.assertIn(path, self.files)
        with open(f"{DOC}/copyright") as f:
            copyright_ = f.read()
        self.assertTrue(copyright_.startswith(
            "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"), copyright_)
        self.assertRegex(copyright_, r"(?m)^Files: \*\nCopyright: .+\nLicense: \S+")
        # the license of the tree (LICENSE, TAP_LICENSE), its full text in Debian's common licenses
        self.assertRegex(copyright_, r"(?m)^Files: \*\nCopyright: .+\nLicense: Apache-2\.0\n")
        self.assertIn('"/usr/share/common-licenses/Apache-2.0"', copyright_)
        for example in ("amqptap.rules.yml", "join-open.jq"):  # the README's alerts and jq join, as files
            self.assertIn(f"{DOC}/examples/{example}", self.files)
        version = sh("dpkg-query", "-W", "-f=${Version}", "amqptap").stdout
        changelog = sh("zcat", f"{DOC}/changelog.Debian.gz").stdout
        self.assertTrue(changelog.startswith(f"amqptap ({version}) "), changelog)
        self.assertRegex(changelog, r"(?m)^ -- .+ <.+@.+>  \w{3}, \d{2} \w{3} \d{4} \d{2}:\d{2}:\d{2} \+0000$")
        self.assertIn(sh(INSTALLED, "--version").stdout.splitlines()[0], " ".join(changelog.split()),
                      "the entry names the build")

    def test_1_binary_is_hardened(self):
        """As Debian hardens its packages (lintian's hardening-no-bindnow, hardening-no-fortify-functions): full
        RELRO (bind now), a stack protector and the checked libc functions of _FORTIFY_SOURCE."""
        dynamic = sh("readelf", "-d", INSTALLED).stdout
        self.assertRegex(dynamic, r"FLAGS_1\)\s+Flags:.*\bNOW\b")
        self.assertIn("GNU_RELRO", sh("readelf", "-l", INSTALLED).stdout)
        symbols = sh("readelf", "--dyn-syms", "-W", INSTALLED).stdout
        self.assertIn("__stack_chk_fail", symbols)
        self.assertRegex(symbols, r"__\w+_chk@")

    def test_2_version(self):
        out = sh(INSTALLED, "--version").stdout.splitlines()
        self.assertRegex(out[0], r"^amqptap \d+\.\d+\.\d+ \(git ([0-9a-f]{12}(-dirty)?|unknown)\)$")
        version = sh("dpkg-query", "-W", "-f=${Version}", "amqptap").stdout
        self.assertTrue(version.startswith(out[0].split()[1]), f"{out[0]} vs package {version}")
        # built from git: the commit count and the commit, so a later build is newer to apt (every build was once
        # 0.1.0-1, and `apt-get install` of a rebuilt package did nothing)
        commit = re.search(r"\(git ([0-9a-f]{12})(-dirty)?\)", out[0])
        shallow = sh("git", "-C", SOURCE_DIR, "rev-parse", "--is-shallow-repository").stdout.strip() == "true"
        if commit and not shallow:
            count = sh("git", "-C", SOURCE_DIR, "rev-list", "--count", commit.group(1)).stdout.strip()
            dirty = ".dirty" if commit.group(2) else ""
            self.assertEqual(version, f"{out[0].split()[1]}+git{count}.g{commit.group(1)}{dirty}-1")
            older = f"{out[0].split()[1]}+git{int(count) - 1}.g{commit.group(1)}-1"
            self.assertEqual(sh("dpkg", "--compare-versions", version, "gt", older, check=False).returncode, 0)
            self.assertEqual(sh("dpkg", "--compare-versions", version, "gt", "0.1.0-1", check=False).returncode, 0)
        self.assertTrue(out[1].startswith("libevent "))
        self.assertIn("OpenSSL", out[2])

    def test_3_real_publish_with_the_shipped_options(self):
        require_broker(self)
        shipped = shlex.split(sh("bash", "-c", f". {DEFAULTS} && printf '%s' \"$AMQPTAP_OPTS\"").stdout)
        self.assertIn("--upstream", shipped)
        port = free_port()
        with tempfile.TemporaryDirectory() as d:
            verdicts = os.path.join(d, "verdicts.jsonl")
            # the unit's command line (--verdicts, then the shipped options), then this test's, which win
            args = [INSTALLED, "--verdicts", verdicts, *shipped, "--listen", f"127.0.0.1:{port}",
                    "--upstream", f"127.0.0.1:{BROKER_PORT}", "-v", "--tap-id", "package-test"]
            with open(os.path.join(d, "stderr"), "w+") as err:
                proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
                try:
                    stderr = lambda: open(err.name).read()  # noqa: E731
                    self.assertTrue(wait_for(lambda: "listening on" in stderr() or proc.poll() is not None, 10))
                    self.assertIsNone(proc.poll(), stderr())
                    conn = pika.BlockingConnection(pika.ConnectionParameters(
                        host="127.0.0.1", port=port, connection_attempts=1, socket_timeout=10))
                    queue = f"amqptap-pkg-{uuid.uuid4().hex[:8]}"
                    ch = conn.channel()
                    ch.queue_declare(queue, auto_delete=True)
                    ch.confirm_delivery()
                    ch.basic_publish("", queue, b"from the package", pika.BasicProperties(message_id="pkg-1"),
                                     mandatory=True)
                    ch.queue_delete(queue)
                    conn.close()
                    proc.send_signal(signal.SIGTERM)
                    self.assertEqual(proc.wait(15), 0, stderr())
                finally:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
                log = stderr()
            pubs = [r for r in read_records(verdicts) if r.get("type") == "publish"]
        self.assertEqual([(r["route"], r["confirm"], r["message_id"]) for r in pubs], [("routed", "ack", "pkg-1")],
                         log)
        self.assertRegex(log, r"amqptap: conn \d+ from 127\.0\.0\.1:\d+ to 127\.0\.0\.1:%d" % BROKER_PORT)

    def test_4_man_page_renders(self):
        self.assertEqual(sh("man", "-w", "amqptap").stdout.strip(), MAN, "man finds the installed page")
        r = sh("man", "--warnings", "-P", "cat", "-l", MAN, env=dict(os.environ, MANWIDTH="100", LC_ALL="C.UTF-8"))
        self.assertEqual(r.stderr, "", "groff warnings")
        text = r.stdout
        for section in ("NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "SIGNALS", "EXIT STATUS", "FILES"):
            self.assertRegex(text, rf"(?m)^{section}$")
        for name in help_options(sh(INSTALLED, "--help").stdout):
            self.assertRegex(text, rf"(?m)^ +(-\w, )?{re.escape(name)}\b" if name.startswith("--")
                             else rf"(?m)^ +{re.escape(name)}, --", f"{name} not in the rendered page")
        self.assertIn("Default: 2000.", re.sub(r"\s+", " ", text), "--return-window shows its default")

    def test_5_completion_offers_every_option(self):
        want = help_options(sh(INSTALLED, "--help").stdout)
        with tempfile.TemporaryDirectory() as d:
            open(os.path.join(d, "capture.pcapng"), "w").close()
            script = (
                ". /usr/share/bash-completion/bash_completion\n"
                "_completion_loader amqptap\n"  # what bash does on the first <Tab>: load the installed file
                "complete -p amqptap\n"
                "comp() { COMP_WORDS=(\"$@\"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMP_LINE=\"$*\";"
                " COMP_POINT=${#COMP_LINE}; COMPREPLY=(); _amqptap amqptap \"${COMP_WORDS[-1]}\" \"${COMP_WORDS[-2]}\";"
                " printf '%s\\n' \"${COMPREPLY[@]}\"; echo ---; }\n"
                "comp amqptap -\n"
                "comp amqptap replay cap\n"
                "comp amqptap --verdicts cap\n"
                "comp amqptap --listen ''\n"
                "comp amqptap ''\n"
                "comp amqptap -vo cap\n"
                "comp amqptap -vo out.jsonl replay cap\n")
            r = sh("bash", "-c", script, cwd=d)
        self.assertIn("complete -F _amqptap amqptap", r.stdout)
        parts = r.stdout.split("---\n")
        options = {w.rstrip("=") for w in parts[0].split("\n")[1:] if w}
        self.assertEqual(options, want)
        self.assertEqual(parts[1].split(), ["capture.pcapng"])
        self.assertEqual(parts[2].split(), ["capture.pcapng"])
        self.assertEqual(parts[3].split(), [], "no file names for an address")
        self.assertEqual(parts[4].split(), ["replay", "sniff", "route", "audit"])  # the subcommands
        self.assertEqual(parts[5].split(), ["capture.pcapng"], "-vo FILE: a bundle ending in an option's letter")
        self.assertEqual(parts[6].split(), ["capture.pcapng"], "-vo FILE is skipped in finding the subcommand")

    def test_6_units_verify(self):
        for unit in ("amqptap.service", "amqptap-sniff@eth0.service"):
            r = sh("systemd-analyze", "verify", os.path.join(UNIT_DIR, unit), check=False)
            self.assertEqual((r.returncode, r.stdout + r.stderr), (0, ""), unit)
        with open(os.path.join(UNIT_DIR, "amqptap.service")) as f:
            unit = f.read()
        for line in ("DynamicUser=yes", "ProtectSystem=strict", "NoNewPrivileges=yes", "LogsDirectory=amqptap",
                     "Restart=on-failure", "EnvironmentFile=-/etc/default/amqptap", "CapabilityBoundingSet=\n",
                     f"ExecStart={INSTALLED} --verdicts /var/log/amqptap/verdicts.jsonl $AMQPTAP_OPTS",
                     "ExecReload=/bin/kill -HUP $MAINPID"):
            self.assertIn(line, unit)
        self.assertNotIn("CAP_NET_RAW", unit, "raw sockets only for the sniff instance")
        with open(os.path.join(UNIT_DIR, "amqptap-sniff@.service")) as f:
            sniff = f.read()
        self.assertIn("AmbientCapabilities=CAP_NET_RAW\n", sniff)
        # One dynamic user for both: systemd gives LogsDirectory= to the user of each unit it starts, so with a
        # user per unit the last one started would own /var/log/amqptap and the others could not reopen their
        # files at rotation (found by running them as separate users: "cannot reopen: Permission denied").
        def identity(text):
            return sorted(re.findall(r"(?m)^(?:DynamicUser|User|Group|LogsDirectory|LogsDirectoryMode)=.*$", text))
        self.assertEqual(identity(unit), identity(sniff))
        self.assertIn("User=amqptap", identity(unit))
        # the interface is the instance name as given: %I would make br-1234 "br/1234"
        exec_start = re.search(r"(?m)^ExecStart=(.*)$", sniff).group(1)
        self.assertIn("--interface %i ", exec_start)
        self.assertNotIn("%I", re.sub(r"(?m)^#.*$", "", sniff))
        unescaped = sh("systemd-escape", "--unescape", "br-1234").stdout.strip()
        self.assertEqual(unescaped, "br/1234", "what %I would have given")

    # Every system call and socket family of a live session (publish, SIGHUP, SIGUSR1, SIGTERM), traced with
    # strace, is one that the unit's SystemCallFilter= and RestrictAddressFamilies= let through: the hardening
    # cannot kill or cripple the service (systemd is not PID 1 here, so the unit itself cannot be started).
    def test_6_unit_sandbox_admits_a_session(self):
        require_broker(self)
        with open(os.path.join(UNIT_DIR, "amqptap.service")) as f:
            unit = f.read()
        groups, group = {}, None
        for line in sh("systemd-analyze", "syscall-filter").stdout.splitlines():
            if line.startswith("@"):
                group = groups.setdefault(line.split()[0], [])
            elif line.strip() and not line.lstrip().startswith("#") and group is not None:
                group.append(line.strip())

        def expand(names):
            out = set()
            for n in names:
                out |= expand(groups[n]) if n.startswith("@") else {n}
            return out

        allowed, denied = set(), set()
        for value in re.findall(r"(?m)^SystemCallFilter=(.*)$", unit):
            if value.startswith("~"):
                denied |= expand(value[1:].split())
            else:
                allowed |= expand(value.split())
        families = set(re.search(r"(?m)^RestrictAddressFamilies=(.*)$", unit).group(1).split())
        port = free_port()
        with tempfile.TemporaryDirectory() as d:
            trace = os.path.join(d, "trace")
            proc = subprocess.Popen(["strace", "-f", "-qq", "-o", trace, INSTALLED, "--listen", f"127.0.0.1:{port}",
                                     "--upstream", f"127.0.0.1:{BROKER_PORT}", "--verdicts",
                                     os.path.join(d, "v.jsonl"), "-v"],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                self.assertTrue(wait_for(lambda: os.path.exists(trace) and f"htons({port})" in open(trace).read()
                                         and "listen(" in open(trace).read(), 10))
                conn = pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=port,
                                                                         connection_attempts=1, socket_timeout=10))
                ch = conn.channel()
                ch.confirm_delivery()
                ch.basic_publish("", "amqptap-pkg-nowhere", b"x")
                conn.close()
                with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
                    tap_pid = int(f.read().split()[0])  # signals go to the tap, not to strace
                for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGTERM):
                    time.sleep(0.2)
                    os.kill(tap_pid, sig)
                self.assertEqual(proc.wait(15), 0, "strace exits with the tap's status")
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            text = open(trace).read()
        # strace lines: "PID name(args) = result"; the first line is strace's own execve of the binary
        used = set(re.findall(r"(?m)^\d+ +([a-z_0-9]+)\(", text)) - {"execve"}
        self.assertIn("accept4", used, "the session was traced")
        self.assertEqual(sorted(used - (allowed - denied)), [], "system calls the unit's filter refuses")
        used_families = set(re.findall(r"socket\((AF_[A-Z0-9]+)", text))
        self.assertTrue(used_families)
        self.assertEqual(sorted(used_families - families), [], "socket families the unit refuses")

    def test_7_logrotate_config(self):
        with tempfile.TemporaryDirectory() as d:
            r = sh("logrotate", "-d", "-s", os.path.join(d, "state"), LOGROTATE, check=False)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertNotRegex(r.stdout + r.stderr, r"(?i)error")
        self.assertIn("/var/log/amqptap/*.jsonl", r.stdout + r.stderr)

    def test_7_logrotate_rotates_records_and_captures(self):
        """A forced rotation with the shipped config renames the records and the --pcap capture (it once rotated
        only *.jsonl, so a capture grew without end)."""
        logs = "/var/log/amqptap"
        made = not os.path.isdir(logs)
        os.makedirs(logs, exist_ok=True)
        names = ("verdicts.jsonl", "taptest.pcapng")
        try:
            for name in names:
                with open(os.path.join(logs, name), "w") as f:
                    f.write("x\n")
            with tempfile.TemporaryDirectory() as d:
                r = sh("logrotate", "-f", "-s", os.path.join(d, "state"), LOGROTATE, check=False)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            for name in names:
                self.assertTrue(os.path.exists(os.path.join(logs, name + ".1")), f"{name} was not rotated")
                self.assertFalse(os.path.exists(os.path.join(logs, name)), "nocreate: the tap makes the new one")
        finally:
            for name in names:
                for suffix in ("", ".1"):
                    if os.path.exists(os.path.join(logs, name + suffix)):
                        os.remove(os.path.join(logs, name + suffix))
            if made:
                os.rmdir(logs)

    def test_8_remove_and_purge(self):
        # enabled as the README says (systemd is not PID 1 here: `systemctl enable` only makes the links)
        for unit in ENABLED:
            sh("systemctl", "enable", unit)
        links = self.enablement_links()
        self.assertEqual(sorted(os.path.basename(p) for p in links), sorted(ENABLED), links)
        r = dpkg("-r", "amqptap")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertFalse(os.path.exists(INSTALLED))
        self.assertEqual(sh("bash", "-c", "command -v amqptap", check=False).stdout, "")
        self.assertTrue(os.path.exists(DEFAULTS), "conffiles stay until purge")
        self.assertEqual(self.enablement_links(), links, "the enablement stays until purge, as conffiles do")
        r = dpkg("-P", "amqptap")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertFalse(installed("amqptap"))
        left = [f for f in self.files if os.path.isfile(f) or os.path.islink(f)]
        self.assertEqual(left, [], "every file of the package is gone")
        left = [os.path.join(d, n) for top in SYSTEMD_DIRS for d, dirs, files in os.walk(top)
                for n in dirs + files if "amqptap" in n]
        self.assertEqual(left, [], "no unit file, drop-in or link of amqptap under systemd's directories")
        self.assertEqual(self.enablement_links(), [], "no link to an amqptap unit left")

    @staticmethod
    def enablement_links():
        """Every symbolic link under systemd's directories named after an amqptap unit or pointing at one."""
        found = []
        for top in SYSTEMD_DIRS:
            for d, dirs, files in os.walk(top):
                for n in dirs + files:
                    p = os.path.join(d, n)
                    if os.path.islink(p) and ("amqptap" in n or "amqptap" in os.readlink(p)):
                        found.append(p)
        return sorted(found)


if __name__ == "__main__":
    main()
