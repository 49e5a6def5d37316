/* Tracker cost: 1,000,000 confirm-mode publishes with 10,000 outstanding, acked with multiple=true every 100;
 * then memory per outstanding publish with 1,000,000 left outstanding (as malloc and as the tracker's memory
 * budget count it); then a plain channel (no confirms, not mandatory) at 100,000 and 1,000,000 publishes a second,
 * ticked every 10 ms as the tap does: what holding its publishes for a publish-caused close costs; then 10,000
 * connections whose acked mandatory publishes wait for a late Return, ticked as often as their timers run out: what
 * finding the due timers among many connections costs. Records go to a byte-counting sink. */
#include "amqptap/track.h"

#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static uint64_t sink_bytes, sink_records;

static void sink(void *ctx, const char *json, size_t len)
{
	(void)ctx;
	(void)json;
	sink_bytes += len + 1;
	sink_records++;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static long maxrss_kb(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_maxrss;
}

static struct tap_slice S(const char *s) {
	return (struct tap_slice){(const uint8_t *)s, strlen(s)};
}

int main(int argc, char **argv)
{
	uint64_t total = argc > 1 ? strtoull(argv[1], NULL, 10) : 1000000;
	uint64_t window = argc > 2 ? strtoull(argv[2], NULL, 10) : 10000;
	uint64_t batch = 100;
	static const char *const rks[] = {"orders.created", "orders.paid", "orders.shipped", "audit"};
	char mid[48];
	int64_t t_us = 1795947302000000LL;

	struct tap_track *t = tap_track_new(NULL, sink, NULL);
	struct tap_track_conn *c = tap_track_conn_new(t, 1, "127.0.0.1:40000", "127.0.0.1:5672", t_us);
	tap_track_conn_user(c, S("guest"));
	tap_track_conn_open(c, S("/"), t_us);
	tap_track_channel_open(c, 1, t_us);
	tap_track_confirm_select(c, 1, t_us);

	struct tap_publish p = {.exchange = S("events"),
	                        .has_message_id = true,
	                        .has_delivery_mode = true,
	                        .delivery_mode = 2,
	                        .body_size = 256,
	                        .content_type = S("application/json")};
	/* phase 1: steady state, `window` outstanding, one multiple ack per `batch` publishes */
	double t0 = now_s();
	uint64_t acked = 0;
	for (uint64_t i = 1; i <= total; i++) {
		snprintf(mid, sizeof mid, "6f1c2a4e-0b7d-4c11-9a3e-%012" PRIx64, i);
		p.message_id = S(mid);
		p.routing_key = S(rks[i & 3]);
		tap_track_publish(c, 1, &p, t_us);
		t_us += 1;
		if (i >= window && (i - window) % batch == 0 && i - window > acked) {
			acked = i - window;
			tap_track_ack(c, 1, acked, true, t_us);
		}
	}
	tap_track_ack(c, 1, total, true, t_us);
	double t1 = now_s();
	struct tap_track_stats s;
	tap_track_get_stats(t, &s);
	printf("phase 1: %" PRIu64 " publishes, %" PRIu64 " outstanding, multiple ack every %" PRIu64 "\n", total,
	       window, batch);
	printf("  %.1f ns per publish (publish + its share of acks + record rendering, mid snprintf included)\n",
	       (t1 - t0) * 1e9 / (double)total);
	printf("  records %" PRIu64 " (%" PRIu64 " publish), %.1f MB of JSON, %.0f B per record\n", sink_records,
	       s.publish_records, (double)sink_bytes / 1e6, (double)sink_bytes / (double)sink_records);
	printf("  peak RSS %ld kB\n", maxrss_kb());
	if (s.publish_records != total || s.outstanding != 0) {
		fprintf(stderr, "invariant broken: %" PRIu64 " records for %" PRIu64 " publishes\n", s.publish_records,
		        total);
		return 1;
	}

	/* phase 2: memory per outstanding publish (same strings: 36-byte message_id, content_type) */
	uint64_t hold = total;
	tap_track_channel_open(c, 2, t_us);
	tap_track_confirm_select(c, 2, t_us);
	struct mallinfo2 m0 = mallinfo2();
	long rss0 = maxrss_kb();
	double t2 = now_s();
	for (uint64_t i = 1; i <= hold; i++) {
		snprintf(mid, sizeof mid, "6f1c2a4e-0b7d-4c11-9a3e-%012" PRIx64, i);
		p.message_id = S(mid);
		p.routing_key = S(rks[i & 3]);
		tap_track_publish(c, 2, &p, t_us);
	}
	double t3 = now_s();
	struct mallinfo2 m1 = mallinfo2();
	long rss1 = maxrss_kb();
	tap_track_get_stats(t, &s);
	printf("phase 2: %" PRIu64 " outstanding (no acks): %.1f ns per publish\n", s.outstanding,
	       (t3 - t2) * 1e9 / (double)hold);
	printf("  heap %.1f B per outstanding publish (allocated, incl. power-of-two slack); peak RSS %ld kB (+%.1f B "
	       "per publish)\n",
	       (double)(m1.uordblks + m1.hblkhd - m0.uordblks - m0.hblkhd) / (double)s.outstanding, rss1,
	       (double)(rss1 - rss0) * 1024.0 / (double)s.outstanding);
	printf("  tracking memory as the budget counts it: %.1f B per outstanding publish (%.1f MB of %.1f MB)\n",
	       (double)s.memory / (double)s.outstanding, (double)s.memory / 1e6,
	       (double)TAP_TRACK_MAX_MEMORY_DEFAULT / 1e6);
	double t4 = now_s();
	tap_track_shutdown(t, t_us + 1);
	double t5 = now_s();
	tap_track_get_stats(t, &s);
	printf("  shutdown wrote %" PRIu64 " records in %.0f ms; publishes %" PRIu64 " == publish records %" PRIu64
	       "\n",
	       hold, (t5 - t4) * 1e3, s.publishes, s.publish_records);
	tap_track_free(t);
	if (s.publishes != s.publish_records)
		return 1;

	/* phase 3: plain channel, each publish held TAP_TRACK_LATE_RETURN_US_DEFAULT */
	static const uint64_t rates[] = {100000, 1000000};
	for (size_t r = 0; r < sizeof rates / sizeof rates[0]; r++) {
		uint64_t gap_ns = 1000000000 / rates[r], n = rates[r]; /* one second of publishes */
		struct tap_track *pt = tap_track_new(NULL, sink, NULL);
		int64_t tp_ns = t_us * 1000, next_tick = t_us + 10000;
		struct tap_track_conn *pc = tap_track_conn_new(pt, 1, "127.0.0.1:40000", "127.0.0.1:5672", t_us);
		tap_track_conn_open(pc, S("/"), t_us);
		tap_track_channel_open(pc, 1, t_us);
		uint64_t peak_mem = 0, peak_out = 0;
		double t6 = now_s();
		for (uint64_t i = 1; i <= n; i++) {
			snprintf(mid, sizeof mid, "6f1c2a4e-0b7d-4c11-9a3e-%012" PRIx64, i);
			p.message_id = S(mid);
			p.routing_key = S(rks[i & 3]);
			tp_ns += (int64_t)gap_ns;
			int64_t now = tp_ns / 1000;
			if (now >= next_tick) {
				tap_track_get_stats(pt, &s);
				if (s.memory > peak_mem)
					peak_mem = s.memory;
				if (s.outstanding > peak_out)
					peak_out = s.outstanding;
				(void)tap_track_tick(pt, now); /* its next deadline: the loop ticks every 10 ms anyway */
				next_tick += 10000;
			}
			tap_track_publish(pc, 1, &p, now);
		}
		double t7 = now_s();
		tap_track_shutdown(pt, tp_ns / 1000 + 1);
		tap_track_get_stats(pt, &s);
		printf("phase 3: plain channel at %" PRIu64 "/s, held %d ms, ticked every 10 ms: %.1f ns per publish\n",
		       rates[r], TAP_TRACK_LATE_RETURN_US_DEFAULT / 1000, (t7 - t6) * 1e9 / (double)n);
		printf("  peak %" PRIu64 " held, peak tracking memory %.2f MB (%.1f B per held publish)\n", peak_out,
		       (double)peak_mem / 1e6, peak_out ? (double)peak_mem / (double)peak_out : 0.0);
		tap_track_free(pt);
		if (s.publishes != s.publish_records || s.unproven != n)
			return 1;
	}

	/* phase 4: many connections with timers: 10,000 confirm-mode connections, one mandatory publish each in turn at
	 * 100,000/s, each acked 1 ms later and then held TAP_TRACK_LATE_RETURN_US_DEFAULT for a late Return; ticked as
	 * the tap ticks, whenever the deadline the last tick returned has come, so about once per publish */
	enum { MANY = 10000, ACK_AFTER = 100 };
	static struct tap_track_conn *mc[MANY];
	static uint64_t mseq[MANY];
	uint64_t n4 = 200000;
	struct tap_track *mt = tap_track_new(NULL, sink, NULL);
	for (int i = 0; i < MANY; i++) {
		mc[i] = tap_track_conn_new(mt, (uint64_t)i + 1, "127.0.0.1:40000", "127.0.0.1:5672", t_us);
		tap_track_conn_open(mc[i], S("/"), t_us);
		tap_track_channel_open(mc[i], 1, t_us);
		tap_track_confirm_select(mc[i], 1, t_us);
	}
	p.mandatory = true;
	int64_t deadline = INT64_MIN, now4 = t_us;
	uint64_t ticks = 0;
	double t8 = now_s();
	for (uint64_t i = 0; i < n4; i++) {
		now4 = t_us + (int64_t)i * 10;
		if (now4 >= deadline) {
			deadline = tap_track_tick(mt, now4);
			ticks++;
		}
		snprintf(mid, sizeof mid, "6f1c2a4e-0b7d-4c11-9a3e-%012" PRIx64, i);
		p.message_id = S(mid);
		p.routing_key = S(rks[i & 3]);
		uint64_t k = i % MANY;
		tap_track_publish(mc[k], 1, &p, now4);
		mseq[k]++;
		if (i >= ACK_AFTER) { /* MANY > ACK_AFTER: that connection has not published since */
			uint64_t j = (i - ACK_AFTER) % MANY;
			tap_track_ack(mc[j], 1, mseq[j], false, now4);
			if (now4 + TAP_TRACK_LATE_RETURN_US_DEFAULT < deadline)
				deadline = now4 + TAP_TRACK_LATE_RETURN_US_DEFAULT;
		}
	}
	double t9 = now_s();
	tap_track_shutdown(mt, now4 + 1);
	tap_track_get_stats(mt, &s);
	printf("phase 4: %d connections, mandatory publishes round-robin at 100000/s, acked after 1 ms and held %d ms: "
	       "%.1f ns per publish, %" PRIu64 " ticks\n",
	       MANY, TAP_TRACK_LATE_RETURN_US_DEFAULT / 1000, (t9 - t8) * 1e9 / (double)n4, ticks);
	tap_track_free(mt);
	if (s.publishes != s.publish_records)
		return 1;
	return 0;
}
