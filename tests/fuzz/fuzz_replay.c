/* libFuzzer harness for the whole replay path: capture reader, reassembly, replay.c's resynchronising and gap
 * handling, the connection observer, the tracker and the --frames trace, over one TCP session built from the
 * input (written by a helper who tested the capture side; seeds: tests/fuzz/corpus/replay/, a golden capture's
 * AMQP bytes each).
 * Input: byte 0 = options (bit0 no handshake, bit1 frames trace, bit2 ISN near 2^32, bits3-7 body bytes),
 * then ops: [ctl][len u16 BE][len bytes]; ctl bit0 = direction (1: broker->client), bits1-3 = what happens to the
 * segment: 0 normal, 1 lost (a hole, acked by the peer), 2 duplicated, 3 delivered after the next op,
 * 4 followed by RST, 5 with FIN, 6 no ack, 7 time jump of 11 minutes before it; bits 4-7: split into that many+1 pieces. */
#include "amqptap/conn.h"
#include "amqptap/replay.h"
#include "amqptap/track.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint8_t *buf;
static size_t blen, bcap;

static void put(const void *p, size_t n)
{
	if (n == 0) /* a bare SYN or ACK has no payload and passes NULL */
		return;
	if (blen + n > bcap) {
		bcap = (blen + n) * 2;
		buf = realloc(buf, bcap);
		if (!buf)
			abort();
	}
	memcpy(buf + blen, p, n);
	blen += n;
}

static void put32(uint32_t v)
{
	put(&v, 4);
}

static int64_t now_us;
static void pkt(int dir, uint8_t flags, uint32_t seq, uint32_t ack, const uint8_t *d, size_t n)
{
	uint8_t h[40] = {0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6};
	size_t tot = 40 + n;
	h[2] = (uint8_t)(tot >> 8);
	h[3] = (uint8_t)tot;
	uint8_t a[4] = {10, 0, 0, 1}, b[4] = {10, 0, 0, 2};
	memcpy(h + 12, dir ? b : a, 4);
	memcpy(h + 16, dir ? a : b, 4);
	uint16_t cp = 40000, sp = 5672;
	uint16_t s = dir ? sp : cp, t = dir ? cp : sp;
	h[20] = (uint8_t)(s >> 8);
	h[21] = (uint8_t)s;
	h[22] = (uint8_t)(t >> 8);
	h[23] = (uint8_t)t;
	for (int k = 0; k < 4; k++) {
		h[24 + k] = (uint8_t)(seq >> (24 - 8 * k));
		h[28 + k] = (uint8_t)(ack >> (24 - 8 * k));
	}
	h[32] = 5 << 4;
	h[33] = flags;
	h[34] = 0xff;
	h[35] = 0xff;
	now_us += 100;
	put32((uint32_t)(now_us / 1000000));
	put32((uint32_t)(now_us % 1000000));
	put32((uint32_t)tot);
	put32((uint32_t)tot);
	put(h, 40);
	put(d, n);
}

static void emit(void *ctx, const char *json, size_t len)
{
	(void)ctx;
	(void)json;
	(void)len;
}

/* A segment held back to be captured after the next one (reordering). */
struct held {
	int dir;
	uint8_t fl;
	uint32_t seq, ack;
	const uint8_t *d;
	size_t n;
	bool on;
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	uint8_t opt = data[0];
	blen = 0;
	now_us = 1700000000LL * 1000000;
	static const uint16_t version[2] = {2, 4};
	put32(0xA1B2C3D4); /* classic pcap, this machine's byte order, raw IP */
	put(version, sizeof version);
	put32(0);
	put32(0);
	put32(262144);
	put32(101);
	uint32_t nx[2];
	nx[0] = (opt & 4) ? 0xFFFFFF00u : 1000;
	nx[1] = (opt & 4) ? 0xFFFFFFF0u : 90000;
	if (!(opt & 1)) {
		pkt(0, 0x02, nx[0], 0, NULL, 0);
		pkt(1, 0x12, nx[1], nx[0] + 1, NULL, 0);
		pkt(0, 0x10, nx[0] + 1, nx[1] + 1, NULL, 0);
	}
	nx[0]++; nx[1]++;
	struct held hold = {0};
	size_t i = 1;
	while (i + 3 <= size) {
		uint8_t ctl = data[i];
		size_t n = (size_t)data[i + 1] << 8 | data[i + 2];
		i += 3;
		if (n > size - i)
			n = size - i;
		const uint8_t *d = data + i;
		i += n;
		int dir = ctl & 1, act = (ctl >> 1) & 7, pieces = (ctl >> 4) + 1;
		if (act == 7)
			now_us += 11 * 60 * 1000000LL;
		size_t step = n / pieces ? n / pieces : 1;
		for (size_t o = 0; o < n || (o == 0 && n == 0); o += step) {
			size_t m = n - o < step ? n - o : step;
			uint8_t fl = 0x18 | (act == 5 && o + m >= n ? 0x01 : 0);
			uint32_t seq = nx[dir];
			nx[dir] += (uint32_t)m + (fl & 1);
			if (act == 1) {
				/* lost */
			} else if (act == 3 && !hold.on) {
				hold = (struct held){dir, fl, seq, nx[!dir], d + o, m, true};
				continue;
			} else {
				pkt(dir, fl, seq, nx[!dir], d + o, m);
				if (act == 2)
					pkt(dir, fl, seq, nx[!dir], d + o, m);
			}
			if (hold.on && act != 3) {
				pkt(hold.dir, hold.fl, hold.seq, hold.ack, hold.d, hold.n);
				hold.on = false;
			}
			if (act != 6)
				pkt(!dir, 0x10, nx[!dir], nx[dir], NULL, 0);
			if (act == 4) {
				pkt(dir, 0x04, nx[dir], 0, NULL, 0);
				break;
			}
			if (n == 0)
				break;
		}
	}
	if (hold.on)
		pkt(hold.dir, hold.fl, hold.seq, hold.ack, hold.d, hold.n);
	struct tap_track *t = tap_track_new(NULL, emit, NULL);
	if (!t)
		return 0;
	struct tap_frames_sink fs = {NULL, emit};
	struct tap_observer o;
	tap_observer_init(&o, t, emit, NULL, (opt & 2) ? &fs : NULL, (uint32_t)(opt >> 3));
	char err[256];
	struct tap_replay_stats st;
	tap_replay_run_mem(buf, blen, "fuzz", 5672, &o, t, &st, err, sizeof err);
	tap_track_free(t);
	tap_observer_deinit(&o);
	return 0;
}
