/* Replay throughput: writes a capture of mixed publish traffic (confirm and plain channels, 64 B..64 kB bodies, CONNS
 * connections) with the pcapng writer, then replays it through the observers and tracker twice: with the tracker ticked
 * at every packet (no hooks: every connection walked per packet) and only when a deadline may be due
 * (hooks.min_window_us, as `amqptap replay` and `sniff` do). Prints MB/s for each and checks both wrote the same
 * records (count and a hash of their bytes, in order). Usage: bench_replay [FILE] [MB] [CONNS] (default
 * /tmp/amqptap-bench.pcapng, 200, 8). */
#include "amqptap/capfile.h"
#include "amqptap/conn.h"
#include "amqptap/buf.h"
#include "amqptap/pcapng.h"
#include "amqptap/replay.h"
#include "amqptap/track.h"

#include "amqptap/spec.h"

#include "../unit/tap_build.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

struct counts {
	uint64_t records;
	uint64_t hash; /* FNV-1a over every record in order: two replays wrote the same records */
};

static void count(void *ctx, const char *json, size_t len)
{
	struct counts *c = ctx;
	c->records++;
	for (size_t i = 0; i < len; i++)
		c->hash = (c->hash ^ (uint8_t)json[i]) * 0x100000001b3ull;
}

/* The pcapng blocks go to a stdio file, as the tap's writer thread would write them. */
struct file_sink {
	FILE *f;
	uint64_t bytes;
};

static void file_write(void *ctx, const void *block, size_t len)
{
	struct file_sink *fs = ctx;
	fs->bytes += fwrite(block, 1, len, fs->f);
}

int main(int argc, char **argv)
{
	const char *path = argc > 1 ? argv[1] : "/tmp/amqptap-bench.pcapng";
	uint64_t target = (argc > 2 ? strtoull(argv[2], NULL, 10) : 200) << 20;
	remove(path);
	struct file_sink out = {fopen(path, "wb"), 0};
	if (!out.f) {
		perror(path);
		return 1;
	}
	(void)setvbuf(out.f, NULL, _IOFBF, 64 * 1024); /* the batch size of the tap's outputs */
	double t0 = now_s();
	struct tap_pcapng *p = tap_pcapng_new(file_write, &out);
	int NCONN = argc > 3 ? atoi(argv[3]) : 8;
	if (NCONN < 1 || NCONN > 60000)
		NCONN = 8;
	struct tap_pcapng_conn **c = calloc((size_t)NCONN, sizeof *c);
	uint64_t *seq = calloc((size_t)NCONN, sizeof *seq);
	int64_t ts = 1764411302000000;
	static uint8_t body[65536];
	for (size_t i = 0; i < sizeof body; i++)
		body[i] = (uint8_t)i;
	struct tap_bytes cb = {0}, sb = {0};
	for (int k = 0; k < NCONN; k++) {
		char client[64];
		snprintf(client, sizeof client, k & 1 ? "[::1]:%d" : "127.0.0.1:%d", 1024 + k);
		c[k] = tap_pcapng_conn_open(p, client, k & 1 ? "[::1]:5672" : "127.0.0.1:5672", ts);
		tap_pcapng_conn_data(c[k], TAP_C2S, (const uint8_t *)"AMQP\0\0\x09\x01", 8, ++ts);
		cb.n = 0;
		tap_build_start_ok(&cb, NULL, "PLAIN", "\0guest\0guest", 12); /* content comes only after a login */
		tap_build_tune_ok_open(&cb, "/");
		tap_build_method(&cb, 1, TAP_CHANNEL_OPEN, "\0", 1);
		if (k % 4 != 3)
			tap_build_method(&cb, 1, TAP_CONFIRM_SELECT, "\0", 1);
		tap_pcapng_conn_data(c[k], TAP_C2S, cb.d, cb.n, ++ts);
	}
	uint64_t pubs = 0;
	uint32_t rnd = 12345;
	while (out.bytes < target) {
		int k = (int)(pubs % NCONN);
		rnd = rnd * 1103515245u + 12345u;
		uint32_t size = (rnd >> 8) % 100 < 90 ? 64 + (rnd >> 16) % 1024 : (rnd >> 12) % 65536;
		cb.n = 0;
		static const uint8_t args[] = {0, 0, 0, 5, 'q', '.', 'o', 'n', 'e', 1};
		tap_build_method(&cb, 1, TAP_BASIC_PUBLISH, args, sizeof args);
		tap_build_header(&cb, 1, size);
		tap_build_frame(&cb, 3, 1, body, size);
		ts += 20;
		tap_pcapng_conn_data(c[k], TAP_C2S, cb.d, cb.n, ts);
		pubs++;
		if (k % 4 != 3) {
			sb.n = 0;
			uint8_t ack[9] = {0};
			uint64_t tag = ++seq[k];
			for (int i = 0; i < 8; i++)
				ack[i] = (uint8_t)(tag >> (56 - 8 * i));
			tap_build_method(&sb, 1, TAP_BASIC_ACK, ack, 9);
			tap_pcapng_conn_data(c[k], TAP_S2C, sb.d, sb.n, ts + 150);
		}
	}
	for (int k = 0; k < NCONN; k++)
		tap_pcapng_conn_close(c[k], TAP_PCAPNG_CLIENT_FIN, ts + 1000);
	tap_pcapng_free(p);
	fclose(out.f);
	double t1 = now_s();
	struct stat st;
	stat(path, &st);
	double mb = (double)st.st_size / (1 << 20);
	printf("write: %" PRIu64 " publishes, %.1f MB in %.2f s = %.0f MB/s\n", pubs, mb, t1 - t0, mb / (t1 - t0));

	free(c);
	free(seq);
	tap_build_free(&cb);
	tap_build_free(&sb);
	uint64_t records[2] = {0}, hash[2] = {0};
	for (int due = 0; due < 2; due++) {
		struct counts cnt = {0, 0xcbf29ce484222325ull};
		struct tap_track *t = tap_track_new(NULL, count, &cnt);
		struct tap_observer o;
		tap_observer_init(&o, t, count, &cnt, NULL, 0);
		char err[256];
		struct tap_replay_hooks hooks = {.min_window_us = TAP_TRACK_LATE_RETURN_US_DEFAULT};
		double t2 = now_s();
		struct tap_capture *c;
		int rc = tap_capfile_open(&c, path, err, sizeof err); /* as `amqptap replay FILE` reads it */
		if (rc == 0) {
			rc = tap_replay_capture(c, 5672, &o, t, due ? &hooks : NULL, NULL, err, sizeof err);
			tap_capture_free(c);
		}
		double t3 = now_s();
		struct tap_track_stats ts_;
		tap_track_get_stats(t, &ts_);
		tap_observer_deinit(&o);
		tap_track_free(t);
		if (rc < 0) {
			fprintf(stderr, "replay: %s\n", err);
			return 1;
		}
		printf("replay (%d connections, tick %s): %.1f MB in %.2f s = %.0f MB/s, %" PRIu64 " records, %" PRIu64
		       " publish records (%" PRIu64 " publishes), records hash %016" PRIx64 "\n",
		       NCONN, due ? "when due      " : "at every packet", mb, t3 - t2, mb / (t3 - t2), cnt.records,
		       ts_.publish_records, pubs, cnt.hash);
		if (ts_.publish_records != pubs) {
			fprintf(stderr, "publish records %" PRIu64 " != publishes %" PRIu64 "\n", ts_.publish_records, pubs);
			return 1;
		}
		records[due] = cnt.records;
		hash[due] = cnt.hash;
	}
	if (records[0] != records[1] || hash[0] != hash[1]) {
		fprintf(stderr, "records differ: %" PRIu64 " ticking at every packet, %" PRIu64 " when due\n", records[0],
			records[1]);
		return 1;
	}
	return 0;
}
