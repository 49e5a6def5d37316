# Every --pcap file the tap writes can be read (src/DESIGN.md §6): whatever file it opens begins with the pcapng Section
# Header and Interface Description Blocks: a file deleted under the tap and made again, one SIGHUP reopens after a
# rename, one that already existed (a second section), and one whose head a full disk lost at the start (written
# again once there is room). pika publishers go through the tap to the throwaway broker; each file must pass
# `tshark -r` and `amqptap replay`, and what the summary counts lost must be what the file lacks.

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid

import pika

from tapharness import BROKER_PORT, TapTestCase, main, read_records, replay, require_broker, start_tap, wait_for

TSHARK = "/usr/bin/tshark"


def publish(port, tag, n=3):
    """n confirmed publishes with message ids TAG-0.. on one connection, closed cleanly; returns the ids."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0, connection_attempts=3))
    ch = conn.channel()
    ch.confirm_delivery()
    ids = [f"{tag}-{i}" for i in range(n)]
    for mid in ids:
        ch.basic_publish("", f"pcapfiles.{uuid.uuid4().hex[:6]}", b"x", pika.BasicProperties(message_id=mid))
    conn.close()
    return set(ids)


def size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


class PcapFiles(TapTestCase):
    def setUp(self):
        super().setUp()
        require_broker(self)
        if not os.access(TSHARK, os.X_OK):
            self.skipTest("tshark missing")
        self.dir = tempfile.mkdtemp(prefix="amqptap-pcapfiles-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def tshark_packets(self, cap):
        """tshark's one-line summaries of cap, which it must read to the end without complaint."""
        r = subprocess.run([TSHARK, "-r", cap, "-d", f"tcp.port=={BROKER_PORT},amqp"], capture_output=True,
                           stdin=subprocess.DEVNULL, timeout=120)
        err = "\n".join(l for l in r.stderr.decode().splitlines() if "Running as user" not in l)
        self.assertEqual((r.returncode, err.strip()), (0, ""), f"tshark -r {cap}")
        return r.stdout.decode().splitlines()

    def replayed_ids(self, cap):
        """The message ids of the publish records `amqptap replay` makes of cap (which it must read cleanly)."""
        out = os.path.join(self.dir, f"replay-{uuid.uuid4().hex[:6]}.jsonl")
        r = replay(cap, BROKER_PORT, verdicts=out)
        self.assertEqual(r.returncode, 0, r.stderr()[-2000:])
        return {p["message_id"] for p in read_records(out) if p["type"] == "publish"}

    def assert_readable(self, cap, ids):
        """tshark reads cap and decodes a Basic.Publish per id; replay gives exactly those publishes."""
        lines = self.tshark_packets(cap)
        self.assertEqual(sum(l.count("Basic.Publish") for l in lines), len(ids), "\n".join(lines[-20:]))
        self.assertEqual(self.replayed_ids(cap), ids)

    def test_deleted_file_is_made_again_with_its_head(self):
        cap = os.path.join(self.dir, "tap.pcapng")
        tap = self.start_tap(["--pcap", cap], frames=False)
        publish(tap.port, "before")
        self.assertTrue(wait_for(lambda: size(cap) > 1000, 5))
        time.sleep(0.1)  # the connection's end too
        os.unlink(cap)
        after = publish(tap.port, "after")
        self.assertTrue(wait_for(lambda: size(cap) > 1000, 5), "the deleted --pcap file was not made again")
        time.sleep(0.1)
        self.assertEqual(tap.stop(), 0, tap.stderr())
        self.assert_readable(cap, after)

    def test_sighup_reopens_with_its_head(self):
        cap = os.path.join(self.dir, "tap.pcapng")
        tap = self.start_tap(["--pcap", cap], frames=False)
        before = publish(tap.port, "before")
        self.assertTrue(wait_for(lambda: size(cap) > 1000, 5))
        time.sleep(0.1)
        os.rename(cap, cap + ".1")
        tap.proc.send_signal(signal.SIGHUP)
        self.assertTrue(wait_for(lambda: os.path.exists(cap), 5), "SIGHUP did not reopen --pcap")
        after = publish(tap.port, "after")
        time.sleep(0.2)
        self.assertEqual(tap.stop(), 0, tap.stderr())
        self.assert_readable(cap + ".1", before)
        self.assert_readable(cap, after)

    def test_existing_file_gets_a_new_section(self):
        """Two runs of the tap append to one file: two sections, read as one capture by tshark and replay."""
        cap = os.path.join(self.dir, "tap.pcapng")
        ids = set()
        for run in range(2):
            tap = self.start_tap(["--pcap", cap], frames=False)
            ids |= publish(tap.port, f"run{run}")
            time.sleep(0.1)
            self.assertEqual(tap.stop(), 0, tap.stderr())
        with open(cap, "rb") as f:
            self.assertEqual(f.read().count(b"\x0a\x0d\x0d\x0a"), 2, "not two Section Header Blocks")
        self.assert_readable(cap, ids)

    def test_head_lost_to_a_full_disk_is_written_again(self):
        """The disk is full when the tap starts, so the head cannot be written; once there is room the head comes
        first, the blocks that could not be written are the ones counted lost, and the file reads."""
        if os.geteuid() != 0:
            self.skipTest("mounting a tmpfs needs root")
        mnt = os.path.join(self.dir, "mnt")
        os.mkdir(mnt)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", mnt], capture_output=True)
        if r.returncode != 0:
            self.skipTest(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
        self.addCleanup(subprocess.run, ["umount", "-l", mnt])
        filler = os.path.join(mnt, "filler")
        with open(filler, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError:
                pass
        cap = os.path.join(mnt, "tap.pcapng")
        tap = start_tap(["--pcap", cap], frames=False)  # it exits 1 (records lost): not the case's own taps
        self.addCleanup(tap.cleanup)
        publish(tap.port, "lost")
        self.assertTrue(wait_for(lambda: "--pcap" in tap.stderr() and "write failed" in tap.stderr(), 5),
                        tap.stderr())
        time.sleep(0.1)
        os.unlink(filler)
        kept = publish(tap.port, "kept")
        time.sleep(0.2)
        self.assertEqual(tap.stop(), 1, tap.stderr())
        err = tap.stderr()
        m = re.findall(r"^output pcap records=(\d+) lost=(\d+) write_errors=\d+ write_failed=(\d+)$", err, re.M)
        self.assertTrue(m, err[-2000:])
        records, lost, failed = map(int, m[-1])
        self.assertGreater(lost, 0)
        self.assertEqual(lost, failed)
        self.assertEqual(len(self.tshark_packets(cap)), records - lost, "the file lacks more than was counted")
        self.assert_readable(cap, kept)


if __name__ == "__main__":
    main()
