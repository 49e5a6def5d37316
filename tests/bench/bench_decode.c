/* Decoder throughput: an in-memory client stream of basic.publish (method + content header + body) with
 * 64 B and 4 KiB bodies, decoded the way the tap does it (frame feed, method decode, props decode), fed in
 * 64 KiB chunks like socket reads. Prints MB/s, frames/s and publishes/s.
 * Usage: bench_decode [publishes-per-size] [body-size ...]   (default 200000, sizes 64 and 4096) */
#include "amqptap/frame.h"
#include "amqptap/props.h"
#include "amqptap/spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHUNK 65536

static uint8_t *put(uint8_t *p, const void *d, size_t n)
{
	memcpy(p, d, n);
	return p + n;
}

static uint8_t *frame_head(uint8_t *p, uint8_t type, uint16_t ch, uint32_t size)
{
	uint8_t h[7] = {type, (uint8_t)(ch >> 8), (uint8_t)ch, (uint8_t)(size >> 24), (uint8_t)(size >> 16),
			(uint8_t)(size >> 8), (uint8_t)size};
	return put(p, h, 7);
}

static size_t build(uint8_t *out, size_t n, size_t body)
{
	static const uint8_t method[] = {0, 60, 0, 40, 0, 0, 8, 'x', '.', 'd', 'i', 'r', 'e', 'c', 't',
					 12, 'o', 'r', 'd', 'e', 'r', 's', '.', 'n', 'e', 'w', '.', '1', 1};
	uint8_t header[64];
	uint8_t *h = header;
	h = put(h, "\x00\x3c\x00\x00", 4);
	for (int i = 7; i >= 0; i--)
		*h++ = (uint8_t)((uint64_t)body >> (8 * i));
	h = put(h, "\x90\x80", 2); /* content-type, delivery-mode, message-id */
	h = put(h, "\x10" "application/json", 17);
	*h++ = 2;
	h = put(h, "\x0a" "msg-000001", 11);
	size_t hlen = (size_t)(h - header);
	uint8_t *p = out;
	memcpy(p, "AMQP\0\0\x09\x01", 8);
	p += 8;
	for (size_t i = 0; i < n; i++) {
		p = frame_head(p, 1, 1, sizeof method);
		p = put(p, method, sizeof method);
		*p++ = 0xCE;
		p = frame_head(p, 2, 1, (uint32_t)hlen);
		p = put(p, header, hlen);
		*p++ = 0xCE;
		p = frame_head(p, 3, 1, (uint32_t)body);
		memset(p, 'a' + (int)(i % 26), body);
		p += body;
		*p++ = 0xCE;
	}
	return (size_t)(p - out);
}

struct result {
	uint64_t frames, publishes, body_bytes;
};

__attribute__((noinline)) static int decode(const uint8_t *s, size_t len, struct result *r)
{
	struct tap_frame_dec d;
	tap_frame_dec_init_client(&d);
	memset(r, 0, sizeof *r);
	for (size_t off = 0; off < len;) {
		size_t end = off + CHUNK < len ? off + CHUNK : len;
		while (off < end) {
			struct tap_frame_ev ev;
			ssize_t k = tap_frame_feed(&d, s + off, end - off, &ev);
			if (k < 0) {
				fprintf(stderr, "decode error %zd at %zu\n", k, off);
				return 1;
			}
			off += (size_t)k;
			switch (ev.kind) {
			case TAP_EV_METHOD: {
				struct tap_method m;
				if (tap_method_decode(ev.data, ev.len, &m) < 0)
					return 1;
				r->publishes += m.def->id == TAP_BASIC_PUBLISH;
				r->frames++;
				break;
			}
			case TAP_EV_HEADER: {
				struct tap_props p;
				if (tap_props_decode(ev.data, ev.len, &p) < 0)
					return 1;
				r->frames++;
				break;
			}
			case TAP_EV_BODY:
				r->body_bytes += ev.len;
				r->frames += ev.frame_end;
				break;
			default:
				break;
			}
		}
	}
	tap_frame_dec_deinit(&d);
	return 0;
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	size_t n = argc > 1 ? strtoul(argv[1], NULL, 10) : 200000;
	size_t sizes[8] = {64, 4096};
	int nsizes = 2;
	if (argc > 2) {
		nsizes = 0;
		for (int i = 2; i < argc && nsizes < 8; i++)
			sizes[nsizes++] = strtoul(argv[i], NULL, 10);
	}
	for (int k = 0; k < nsizes; k++) {
		size_t body = sizes[k];
		size_t cap = 8 + n * (body + 120);
		uint8_t *s = malloc(cap);
		if (!s)
			return 1;
		size_t len = build(s, n, body);
		struct result r;
		double best = 1e30;
		int reps = n >= 1000 ? 5 : 1;
		for (int rep = 0; rep < reps; rep++) {
			double t0 = now();
			if (decode(s, len, &r))
				return 1;
			double t = now() - t0;
			if (t < best)
				best = t;
		}
		if (r.publishes != n || r.frames != 3 * n || r.body_bytes != n * body) {
			fprintf(stderr, "miscount: %llu publishes, %llu frames\n", (unsigned long long)r.publishes,
				(unsigned long long)r.frames);
			return 1;
		}
		printf("body %5zu B: %zu publishes, %.1f MB in %.3f s: %8.1f MB/s %10.0f frames/s %10.0f publishes/s\n",
		       body, n, (double)len / 1e6, best, (double)len / 1e6 / best, (double)r.frames / best,
		       (double)r.publishes / best);
		free(s);
	}
	return 0;
}
