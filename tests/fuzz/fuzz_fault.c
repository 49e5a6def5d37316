/* libFuzzer harness for the fault rules and their rewriter (src/core/fault.c, fault_rw.c, fault_shape.c). The first byte picks:
 * even, the rest is one rule for tap_fault_parse (an accepted rule must be printable and name a known action; a
 * refused one gets a one-line message naming it); odd, the rest is cut at its first NUL into a rule and two streams
 * (client and broker, interleaved in chunks whose sizes the next bytes give) fed to a rewriter under that rule.
 * The client's stream must come out as a prefix of itself (cut only by a kill, or inside a header it ends in;
 * close-channel drops, holds and adds frames of its own, so there only memory safety and the bounds are checked),
 * and the held bytes released.
 * Seeds: tests/fuzz/corpus/fault/. */
#include "amqptap/fault.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct out {
	const uint8_t *c2s;
	size_t c2s_len, c2s_at, s2c_at;
	bool rewrites_client; /* close-channel */
};

static void emit(void *ctx, enum tap_dir dir, const uint8_t *p, size_t len)
{
	struct out *o = ctx;
	if (dir == TAP_C2S && o->rewrites_client) {
		o->c2s_at += len;
	} else if (dir == TAP_C2S) {
		if (o->c2s_at + len > o->c2s_len || memcmp(o->c2s + o->c2s_at, p, len) != 0)
			abort(); /* the client's bytes are never changed */
		o->c2s_at += len;
	} else {
		o->s2c_at += len;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size > 65536)
		return 0;
	char spec[TAP_FAULT_SPEC_MAX];
	char err[400];
	struct tap_fault_rule r;
	const uint8_t *nul = memchr(data + 1, 0, size - 1);
	size_t sl = nul ? (size_t)(nul - data - 1) : size - 1;
	if (sl >= sizeof spec)
		sl = sizeof spec - 1;
	memcpy(spec, data + 1, sl);
	spec[sl] = '\0';
	int rc = tap_fault_parse(spec, &r, err, sizeof err);
	if (rc != 0) {
		if (strchr(err, 0x0a) || strncmp(err, "--fault '", 9) != 0)
			abort();
		if (data[0] % 2 == 0)
			return 0;
		tap_fault_parse("nack:every=2", &r, err, sizeof err);
	} else if ((unsigned)r.action >= TAP_FAULT_ACTIONS || strcmp(r.text, spec) != 0) {
		abort();
	}
	if (data[0] % 2 == 0 || !nul)
		return 0;
	struct tap_fault_set set;
	tap_fault_set_init(&set);
	tap_fault_set_add(&set, &r, 0, NULL);
	struct tap_fault_conn *fc = tap_fault_conn_new(&set, 1, "127.0.0.1:1");
	if (!fc)
		return 0;
	const uint8_t *rest = nul + 1;
	size_t n = size - (size_t)(rest - data);
	/* the rest: [cut byte][chunk] ... the cut byte's low bit says the direction, the others its length */
	static uint8_t c2s[65536];
	size_t c2s_len = 0;
	for (size_t at = 0; at < n;) {
		uint8_t cut = rest[at++];
		size_t len = (size_t)(cut >> 1) + 1;
		if (len > n - at)
			len = n - at;
		if (cut & 1) {
			memcpy(c2s + c2s_len, rest + at, len);
			c2s_len += len;
		}
		at += len;
	}
	struct out o = {.c2s = c2s, .c2s_len = c2s_len, .rewrites_client = r.action == TAP_FAULT_CLOSE_CHANNEL};
	struct tap_fault_io io = {.ctx = &o, .emit = emit};
	int64_t now = 0;
	for (size_t at = 0; at < n;) {
		uint8_t cut = rest[at++];
		size_t len = (size_t)(cut >> 1) + 1;
		if (len > n - at)
			len = n - at;
		now += 1000;
		tap_fault_feed(fc, cut & 1 ? TAP_C2S : TAP_S2C, rest + at, len, now, &io);
		at += len;
	}
	/* everything held is released by its due times (bandwidth: a bucket's worth at a time, 1 KiB/s at the
	 * slowest: 10 bytes a wakeup), each due time later than the last but for the first */
	now += 3600000000LL + 1;
	unsigned st = tap_fault_release(fc, now, &io);
	for (long wakeups = 0; st & TAP_FAULT_HOLDING; wakeups++) {
		int64_t due = tap_fault_due(fc);
		if (due == INT64_MAX || due <= now || wakeups > 100000)
			abort();
		now = due;
		st = tap_fault_release(fc, now, &io);
	}
	if (tap_fault_due(fc) != INT64_MAX)
		abort();
	bool held = st & (TAP_FAULT_KILL_ARMED | TAP_FAULT_BLOCKED | TAP_FAULT_CLIENT_WAIT);
	if (!held && !o.rewrites_client && c2s_len - o.c2s_at > 6)
		abort(); /* a client stream not cut by a kill goes on whole, but for a header it ends inside */
	tap_fault_conn_free(fc);
	return 0;
}
