/* Capture reader: every file format variant and link type, TCP reassembly (out of order, retransmissions,
 * overlaps, mid-connection start, RST, bounded buffering), truncated and corrupt files, and a real loopback
 * recording from tests/data/capture/. */
#include "amqptap/capture.h"
#include "amqptap/jsonl.h"
#include "amqptap/status.h"
#include "reasm.h"

#include <check.h>

#include "tap_check.h"
#include "tap_file.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- packet and file builders ---- */

#define F_FIN 0x01
#define F_SYN 0x02
#define F_RST 0x04
#define F_PSH 0x08
#define F_ACK 0x10

struct pkt {
	uint8_t data[70000];
	size_t len;
	int64_t ts;
};

struct ep {
	bool v6;
	uint8_t addr[16];
	uint16_t port;
};

static void be16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

static void be32(uint8_t *p, uint32_t v)
{
	be16(p, (uint16_t)(v >> 16));
	be16(p + 2, (uint16_t)v);
}

/* An IP packet (with optional IPv4 options / one IPv6 destination-options header) carrying one TCP segment. */
static size_t ip_tcp(uint8_t *out, const struct ep *src, const struct ep *dst, uint32_t seq, uint32_t ack,
		     uint8_t flags, const void *payload, size_t len, bool extra)
{
	size_t off;
	if (src->v6) {
		memset(out, 0, 40);
		out[0] = 0x60;
		out[6] = extra ? 60 : 6;
		out[7] = 64;
		memcpy(out + 8, src->addr, 16);
		memcpy(out + 24, dst->addr, 16);
		off = 40;
		if (extra) {
			memset(out + off, 0, 16);
			out[off] = 6;
			out[off + 1] = 1; /* (1+1)*8 = 16 bytes */
			off += 16;
		}
		be16(out + 4, (uint16_t)(off - 40 + 20 + len));
	} else {
		size_t ihl = extra ? 24 : 20;
		memset(out, 0, ihl);
		out[0] = (uint8_t)(0x40 | ihl / 4);
		be16(out + 2, (uint16_t)(ihl + 20 + len));
		out[8] = 64;
		out[9] = 6;
		memcpy(out + 12, src->addr, 4);
		memcpy(out + 16, dst->addr, 4);
		if (extra)
			out[20] = 1; /* NOP options */
		off = ihl;
	}
	uint8_t *t = out + off;
	memset(t, 0, 20);
	be16(t, src->port);
	be16(t + 2, dst->port);
	be32(t + 4, seq);
	be32(t + 8, ack);
	t[12] = 5 << 4;
	t[13] = flags;
	be16(t + 14, 65535);
	if (len)
		memcpy(t + 20, payload, len);
	return off + 20 + len;
}

/* Wraps an IP packet in a link-layer header. */
static size_t link_wrap(uint8_t *out, uint32_t linktype, const uint8_t *ip, size_t len, bool v6, bool vlan)
{
	size_t h = 0;
	uint16_t et = v6 ? 0x86DD : 0x0800;
	switch (linktype) {
	case 1:
		memset(out, 0xAA, 12);
		h = 12;
		if (vlan) {
			be16(out + h, 0x8100);
			be16(out + h + 2, 7);
			h += 4;
		}
		be16(out + h, et);
		h += 2;
		break;
	case 0: /* host byte order family */
	{
		uint32_t fam = v6 ? 30 : 2;
		memcpy(out, &fam, 4);
		h = 4;
		break;
	}
	case 108:
		be32(out, v6 ? 24 : 2);
		h = 4;
		break;
	case 113:
		memset(out, 0, 16);
		be16(out + 14, et);
		h = 16;
		break;
	case 276:
		memset(out, 0, 20);
		be16(out, et);
		h = 20;
		break;
	default:
		break;
	}
	memcpy(out + h, ip, len);
	return h + len;
}

/* A scripted TCP conversation: client c, server s, with the current sequence numbers of both. */
struct conv {
	struct ep c, s;
	uint32_t cseq, sseq;
	struct pkt *pkts;
	size_t n;
	int64_t ts;
	bool extra;
};

static void conv_init(struct conv *v, bool v6, uint16_t cport, uint16_t sport, struct pkt *pkts)
{
	memset(v, 0, sizeof *v);
	v->c.v6 = v->s.v6 = v6;
	if (v6) {
		v->c.addr[15] = 1;
		v->s.addr[0] = 0x20;
		v->s.addr[1] = 0x01;
		v->s.addr[15] = 2;
	} else {
		memcpy(v->c.addr, "\x0a\x00\x00\x01", 4);
		memcpy(v->s.addr, "\x0a\x00\x00\x02", 4);
	}
	v->c.port = cport;
	v->s.port = sport;
	v->cseq = 0xFFFFFF00u; /* wraps inside the test data */
	v->sseq = 1000;
	v->pkts = pkts;
	v->ts = 1700000000000000;
}

/* Appends a packet; seq taken from (and advanced in) the conversation unless `seq` is given. */
static void conv_raw(struct conv *v, bool c2s, uint32_t seq, uint8_t flags, const void *data, size_t len)
{
	struct pkt *p = &v->pkts[v->n++];
	p->ts = v->ts;
	v->ts += 1000;
	p->len = ip_tcp(p->data, c2s ? &v->c : &v->s, c2s ? &v->s : &v->c, seq, c2s ? v->sseq : v->cseq, flags,
			data, len, v->extra);
}

static void conv_send(struct conv *v, bool c2s, uint8_t flags, const void *data, size_t len)
{
	uint32_t *seq = c2s ? &v->cseq : &v->sseq;
	conv_raw(v, c2s, *seq, flags, data, len);
	*seq += (uint32_t)len + ((flags & (F_SYN | F_FIN)) ? 1 : 0);
}

static void conv_open(struct conv *v)
{
	conv_send(v, true, F_SYN, NULL, 0);
	conv_send(v, false, F_SYN | F_ACK, NULL, 0);
	conv_send(v, true, F_ACK, NULL, 0);
}

static void conv_close(struct conv *v)
{
	conv_send(v, true, F_FIN | F_ACK, NULL, 0);
	conv_send(v, false, F_ACK, NULL, 0);
	conv_send(v, false, F_FIN | F_ACK, NULL, 0);
	conv_send(v, true, F_ACK, NULL, 0);
}

static void put32le(struct tap_buf *b, uint32_t v, bool swap)
{
	if (swap)
		v = __builtin_bswap32(v);
	tap_buf_append(b, &v, 4);
}

static void put16le(struct tap_buf *b, uint16_t v, bool swap)
{
	if (swap)
		v = __builtin_bswap16(v);
	tap_buf_append(b, &v, 2);
}

static void write_pcap(struct tap_buf *b, const struct pkt *pkts, size_t n, uint32_t linktype, bool swap, bool ns,
		       bool v6)
{
	put32le(b, ns ? 0xA1B23C4D : 0xA1B2C3D4, swap);
	put16le(b, 2, swap);
	put16le(b, 4, swap);
	put32le(b, 0, swap);
	put32le(b, 0, swap);
	put32le(b, 262144, swap);
	put32le(b, linktype, swap);
	static uint8_t frame[70100];
	for (size_t i = 0; i < n; i++) {
		size_t len = link_wrap(frame, linktype & 0x03FFFFFF, pkts[i].data, pkts[i].len, v6, false);
		put32le(b, (uint32_t)(pkts[i].ts / 1000000), swap);
		put32le(b, (uint32_t)(pkts[i].ts % 1000000) * (ns ? 1000 : 1), swap);
		put32le(b, (uint32_t)len, swap);
		put32le(b, (uint32_t)len, swap);
		tap_buf_append(b, frame, len);
	}
}

static void ng_block(struct tap_buf *b, uint32_t type, const struct tap_buf *body, bool swap)
{
	uint32_t total = (uint32_t)(12 + ((body->len + 3) & ~(size_t)3));
	put32le(b, type, swap);
	put32le(b, total, swap);
	tap_buf_append(b, body->data, body->len);
	static const uint8_t zero[4];
	tap_buf_append(b, zero, (4 - (body->len & 3)) & 3);
	put32le(b, total, swap);
}

static void ng_shb(struct tap_buf *b, bool swap)
{
	struct tap_buf body;
	tap_buf_init(&body);
	put32le(&body, 0x1A2B3C4D, swap);
	put16le(&body, 1, swap);
	put16le(&body, 0, swap);
	put32le(&body, 0xFFFFFFFF, swap);
	put32le(&body, 0xFFFFFFFF, swap);
	ng_block(b, 0x0A0D0D0A, &body, swap);
	tap_buf_deinit(&body);
}

/* tsresol: the raw option byte (0x06 µs, 0x09 ns, 0x94 2^-20 s); 0 writes no option. */
static void ng_idb(struct tap_buf *b, uint16_t linktype, uint8_t tsresol, bool swap)
{
	struct tap_buf body;
	tap_buf_init(&body);
	put16le(&body, linktype, swap);
	put16le(&body, 0, swap);
	put32le(&body, 0, swap);
	if (tsresol) {
		put16le(&body, 9, swap);
		put16le(&body, 1, swap);
		tap_buf_append(&body, &tsresol, 1);
		tap_buf_append(&body, "\0\0\0", 3);
	}
	put32le(&body, 0, swap);
	ng_block(b, 1, &body, swap);
	tap_buf_deinit(&body);
}

/* An Ethernet IDB whose if_tsoffset (signed seconds, added to every timestamp) is offset. */
static void ng_idb_tsoffset(struct tap_buf *b, int64_t offset, bool swap)
{
	struct tap_buf body;
	tap_buf_init(&body);
	put16le(&body, 1, swap);
	put16le(&body, 0, swap);
	put32le(&body, 0, swap);
	put16le(&body, 14, swap);
	put16le(&body, 8, swap);
	uint64_t o = (uint64_t)offset;
	put32le(&body, (uint32_t)(swap ? o >> 32 : o), swap);
	put32le(&body, (uint32_t)(swap ? o : o >> 32), swap);
	put32le(&body, 0, swap);
	ng_block(b, 1, &body, swap);
	tap_buf_deinit(&body);
}

static void ng_epb(struct tap_buf *b, uint32_t ifid, uint64_t units, const uint8_t *data, size_t len, bool swap)
{
	struct tap_buf body;
	tap_buf_init(&body);
	put32le(&body, ifid, swap);
	put32le(&body, (uint32_t)(units >> 32), swap);
	put32le(&body, (uint32_t)units, swap);
	put32le(&body, (uint32_t)len, swap);
	put32le(&body, (uint32_t)len, swap);
	tap_buf_append(&body, data, len);
	ng_block(b, 6, &body, swap);
	tap_buf_deinit(&body);
}

/* ---- collecting callbacks ---- */

struct got_stream {
	uint64_t id;
	char client[64], server[64];
	bool midstream, closed;
	enum tap_capture_end how;
	struct tap_buf bytes[TAP_DIR_COUNT];
	int64_t first_ts[TAP_DIR_COUNT], open_ts, close_ts;
	uint64_t gaps;
	uint64_t missing[TAP_DIR_COUNT]; /* bytes the gaps lost */
	int64_t gap_ts;                  /* of the last gap */
};

struct got {
	struct got_stream s[16];
	size_t n;
	uint64_t packets;
};

static void *g_open(void *ctx, uint64_t id, const char *client, const char *server, bool midstream, int64_t ts)
{
	struct got *g = ctx;
	ck_assert_uint_lt(g->n, 16);
	struct got_stream *s = &g->s[g->n++];
	memset(s, 0, sizeof *s);
	s->id = id;
	snprintf(s->client, sizeof s->client, "%s", client);
	snprintf(s->server, sizeof s->server, "%s", server);
	s->midstream = midstream;
	s->open_ts = ts;
	tap_buf_init(&s->bytes[TAP_S2C]);
	tap_buf_init(&s->bytes[TAP_C2S]);
	return s;
}

static void g_data(void *ctx, void *user, enum tap_dir dir, const uint8_t *data, size_t len, int64_t ts)
{
	(void)ctx;
	struct got_stream *s = user;
	ck_assert(!s->closed);
	if (s->bytes[dir].len == 0)
		s->first_ts[dir] = ts;
	tap_buf_append(&s->bytes[dir], data, len);
}

static void g_gap(void *ctx, void *user, enum tap_dir dir, uint64_t missing, int64_t ts)
{
	(void)ctx;
	struct got_stream *s = user;
	s->gaps++;
	s->missing[dir] += missing;
	s->gap_ts = ts;
}

static void g_close(void *ctx, void *user, enum tap_capture_end how, int64_t ts)
{
	(void)ctx;
	struct got_stream *s = user;
	ck_assert(!s->closed);
	s->closed = true;
	s->how = how;
	s->close_ts = ts;
}

static void g_packet(void *ctx, int64_t ts)
{
	(void)ts;
	((struct got *)ctx)->packets++;
}

static void got_free(struct got *g)
{
	for (size_t i = 0; i < g->n; i++) {
		tap_buf_deinit(&g->s[i].bytes[TAP_S2C]);
		tap_buf_deinit(&g->s[i].bytes[TAP_C2S]);
	}
}

/* idle_us, max_streams: tap_capture_set_limits (0: the defaults); stats, when not NULL, gets the counts. */
static int run_mem_limits(const void *data, size_t len, uint16_t port, struct got *g, int64_t idle_us,
			  size_t max_streams, struct tap_capture_stats *stats, char *err, size_t cap)
{
	memset(g, 0, sizeof *g);
	struct tap_capture_cb cb = {.ctx = g, .packet = g_packet, .open = g_open, .data = g_data, .gap = g_gap,
				    .close = g_close};
	struct tap_capture *c;
	int rc = tap_capture_open_mem(&c, data, len, "mem.cap", err, cap);
	if (rc < 0)
		return rc;
	tap_capture_set_limits(c, idle_us, max_streams);
	rc = tap_capture_run(c, port, &cb, err, cap);
	if (stats)
		tap_capture_get_stats(c, stats);
	tap_capture_free(c);
	return rc;
}

static int run_mem(const void *data, size_t len, uint16_t port, struct got *g, char *err, size_t cap)
{
	return run_mem_limits(data, len, port, g, 0, 0, NULL, err, cap);
}

static void assert_bytes(const struct tap_buf *b, const char *want)
{
	ck_assert_uint_eq(b->len, strlen(want));
	ck_assert(b->len == 0 || memcmp(b->data, want, b->len) == 0); /* an empty buffer may have no data */
}

#define MAX_PKTS 128
static struct pkt pk[MAX_PKTS];

/* A complete conversation: handshake, two requests, two answers, FIN from the client first. */
static size_t basic_conv(bool v6, bool extra)
{
	struct conv v;
	conv_init(&v, v6, 40000, 5672, pk);
	v.extra = extra;
	conv_open(&v);
	conv_send(&v, true, F_PSH | F_ACK, "AMQP\0\0\x09\x01", 8);
	conv_send(&v, false, F_PSH | F_ACK, "start", 5);
	conv_send(&v, true, F_PSH | F_ACK, "hello-", 6);
	conv_send(&v, true, F_PSH | F_ACK, "world", 5);
	conv_send(&v, false, F_PSH | F_ACK, "-ok", 3);
	conv_close(&v);
	return v.n;
}

static void check_stream(const struct got_stream *s, bool v6)
{
	ck_assert_uint_eq(s->id, 1);
	ck_assert_str_eq(s->client, v6 ? "[::1]:40000" : "10.0.0.1:40000");
	ck_assert_str_eq(s->server, v6 ? "[2001::2]:5672" : "10.0.0.2:5672");
	ck_assert(!s->midstream);
	ck_assert(s->closed);
	ck_assert_int_eq(s->how, TAP_CAPTURE_END_CLIENT_FIN);
	ck_assert_uint_eq(s->bytes[TAP_C2S].len, 19);
	ck_assert(memcmp(s->bytes[TAP_C2S].data, "AMQP\0\0\x09\x01hello-world", 19) == 0);
	assert_bytes(&s->bytes[TAP_S2C], "start-ok");
	ck_assert_int_eq(s->open_ts, 1700000000000000);
	ck_assert_int_eq(s->first_ts[TAP_S2C], 1700000000004000);
}

static void check_basic(const struct got *g, bool v6)
{
	ck_assert_uint_eq(g->n, 1);
	check_stream(&g->s[0], v6);
}

START_TEST(pcap_every_variant_and_link_type)
{
	static const uint32_t links[] = {0, 1, 101, 108, 113, 228, 229, 276};
	for (int v6 = 0; v6 < 2; v6++) {
		size_t n = basic_conv(v6, v6);
		for (size_t l = 0; l < sizeof links / sizeof links[0]; l++) {
			if ((links[l] == 228 && v6) || (links[l] == 229 && !v6))
				continue;
			for (int variant = 0; variant < 4; variant++) {
				struct tap_buf b;
				tap_buf_init(&b);
				write_pcap(&b, pk, n, links[l], variant & 1, variant & 2, v6);
				struct got g;
				char err[256] = "";
				int rc = run_mem(b.data, b.len, 5672, &g, err, sizeof err);
				ck_assert_msg(rc == 0, "link %u variant %d: %s", links[l], variant, err);
				check_basic(&g, v6);
				ck_assert_uint_eq(g.packets, n);
				got_free(&g);
				tap_buf_deinit(&b);
			}
		}
	}
}
END_TEST

/* Packets real captures hold that the reader must not lose, each decoded as the plain conversation: IPv4 with
 * total length 0 (TSO, captured on the sender), IPv6 with an atomic fragment header, a Linux cooked header whose
 * protocol is a VLAN tag, and a pcap header with the FCS-present bit. What it cannot read is counted, never
 * silently: another link type (PPP) and IPv4 fragments. */
static void run_pkts_stats(uint32_t linktype, size_t n, struct got *g, struct tap_capture_stats *st)
{
	struct tap_buf b;
	tap_buf_init(&b);
	write_pcap(&b, pk, n, linktype, false, false, pk[0].data[0] >> 4 == 6);
	char err[256] = "";
	ck_assert_msg(run_mem_limits(b.data, b.len, 5672, g, 0, 0, st, err, sizeof err) == 0, "%s", err);
	tap_buf_deinit(&b);
}

START_TEST(packets_the_reader_must_not_lose)
{
	struct got g;
	struct tap_capture_stats st;
	size_t n = basic_conv(false, false);
	for (size_t i = 0; i < n; i++)
		be16(pk[i].data + 2, 0); /* total length 0 */
	run_pkts_stats(1 | 0x04000000, n, &g, &st); /* and an FCS flag in the link type */
	check_basic(&g, false);
	ck_assert_uint_eq(st.skipped, 0);
	got_free(&g);

	n = basic_conv(true, false);
	for (size_t i = 0; i < n; i++) { /* an atomic fragment header after the fixed header */
		struct pkt *q = &pk[i];
		memmove(q->data + 48, q->data + 40, q->len - 40);
		memset(q->data + 40, 0, 8);
		q->data[40] = q->data[6];
		q->data[6] = 44;
		be32(q->data + 44, (uint32_t)i);
		be16(q->data + 4, (uint16_t)(q->len - 40 + 8));
		q->len += 8;
	}
	run_pkts_stats(101, n, &g, &st);
	check_basic(&g, true);
	got_free(&g);

	n = basic_conv(false, false);
	for (size_t i = 0; i < n; i++) { /* raw IP made into SLL with a tag: 16 bytes, then TCI and the EtherType */
		struct pkt *q = &pk[i];
		memmove(q->data + 20, q->data, q->len);
		memset(q->data, 0, 20);
		be16(q->data + 14, 0x8100);
		be16(q->data + 16, 7);
		be16(q->data + 18, 0x0800);
		q->len += 20;
	}
	run_pkts_stats(0x04000000 | 999, n, &g, &st); /* not read: counted with its link type */
	ck_assert_uint_eq(g.n, 0);
	ck_assert_uint_eq(st.unknown_link, n);
	ck_assert_uint_eq(st.unknown_linktype, 999);
	got_free(&g);
	struct tap_buf b;
	tap_buf_init(&b);
	write_pcap(&b, pk, n, 101, false, false, false); /* the frames as they are, under an SLL file header */
	memcpy(b.data + 20, "\x71\x00\x00\x00", 4);
	char err[256] = "";
	ck_assert_msg(run_mem_limits(b.data, b.len, 5672, &g, 0, 0, &st, err, sizeof err) == 0, "%s", err);
	check_basic(&g, false);
	got_free(&g);
	tap_buf_deinit(&b);

	n = basic_conv(false, false);
	size_t frags = 0;
	for (size_t i = 0; i < n; i++)
		if (pk[i].len > 40) {
			be16(pk[i].data + 6, 0x2000); /* more fragments */
			frags++;
		}
	run_pkts_stats(101, n, &g, &st);
	ck_assert_uint_eq(st.fragments, frags);
	ck_assert_uint_eq(st.skipped, frags);
	got_free(&g);

	n = basic_conv(false, false); /* only the client's packets: said, as a capture of one direction */
	size_t kept = 0;
	for (size_t i = 0; i < n; i++)
		if (memcmp(pk[i].data + 12, "\x0a\x00\x00\x01", 4) == 0)
			pk[kept++] = pk[i];
	run_pkts_stats(101, kept, &g, &st);
	ck_assert_uint_eq(g.n, 1);
	ck_assert_uint_eq(st.one_way, 1);
	got_free(&g);
	n = basic_conv(false, false);
	run_pkts_stats(101, n, &g, &st);
	ck_assert_uint_eq(st.one_way, 0);
	got_free(&g);
}
END_TEST

/* if_tsoffset is signed (pcapng §4.2): an hour back and an hour forward, either byte order. */
START_TEST(pcapng_tsoffset_either_sign)
{
	size_t n = basic_conv(false, false);
	static const int64_t offsets[] = {-3600, 3600};
	for (int swap = 0; swap < 2; swap++)
		for (size_t k = 0; k < 2; k++) {
			struct tap_buf b;
			tap_buf_init(&b);
			ng_shb(&b, swap);
			ng_idb_tsoffset(&b, offsets[k], swap);
			static uint8_t frame[70100];
			for (size_t i = 0; i < n; i++) {
				size_t len = link_wrap(frame, 1, pk[i].data, pk[i].len, false, false);
				ng_epb(&b, 0, (uint64_t)pk[i].ts, frame, len, swap);
			}
			struct got g;
			char err[256] = "";
			ck_assert_msg(run_mem(b.data, b.len, 5672, &g, err, sizeof err) == 0, "%s", err);
			ck_assert_uint_eq(g.n, 1);
			ck_assert_int_eq(g.s[0].open_ts, pk[0].ts + offsets[k] * 1000000);
			got_free(&g);
			tap_buf_deinit(&b);
		}
}
END_TEST

/* Replays capture b of basic_conv's conversation, whatever its clocks: one stream with all its bytes; its stats. */
static void replay_basic_conv(const struct tap_buf *b, struct tap_capture_stats *st)
{
	struct got g;
	char err[256] = "";
	ck_assert_msg(run_mem_limits(b->data, b->len, 5672, &g, 0, 0, st, err, sizeof err) == 0, "%s", err);
	ck_assert_uint_eq(g.n, 1);
	assert_bytes(&g.s[0].bytes[TAP_S2C], "start-ok");
	ck_assert_uint_eq(g.s[0].bytes[TAP_C2S].len, 19);
	got_free(&g);
}

/* A merge of two hosts' captures whose clocks differ by an hour: the client's packets on one interface, the
 * broker's on the other. Streams age by the latest time seen, so the late clock's packets do not make the
 * connection look idle and split it into many mid-stream ones. */
START_TEST(pcapng_interfaces_with_clocks_apart)
{
	size_t n = basic_conv(false, false);
	struct tap_buf b;
	tap_buf_init(&b);
	ng_shb(&b, false);
	ng_idb(&b, 1, 0, false);
	ng_idb(&b, 1, 0, false);
	static uint8_t frame[70100];
	for (size_t i = 0; i < n; i++) {
		bool from_client = memcmp(pk[i].data + 12, "\x0a\x00\x00\x01", 4) == 0;
		size_t len = link_wrap(frame, 1, pk[i].data, pk[i].len, false, false);
		ng_epb(&b, from_client ? 0 : 1, (uint64_t)(pk[i].ts + (from_client ? 0 : 3600000000)), frame, len, false);
	}
	struct tap_capture_stats st;
	replay_basic_conv(&b, &st);
	ck_assert_uint_eq(st.clock_steps, 1);
	ck_assert_uint_gt(st.clock_back, 0);
	tap_buf_deinit(&b);
}
END_TEST

/* Two packets stamped 2 s before the ones around them count as two clock steps back, once each, whatever else
 * (a stream's close, expiry) looks at the clock at their time. The stream is whole: they are in order on the wire. */
START_TEST(clock_back_counts_packets)
{
	size_t n = basic_conv(false, false);
	ck_assert_uint_gt(n, 8);
	pk[4].ts -= 2000000;
	pk[n - 1].ts -= 2000000; /* the last: it closes the stream */
	struct tap_buf b;
	tap_buf_init(&b);
	write_pcap(&b, pk, n, 1, false, false, false);
	struct tap_capture_stats st;
	replay_basic_conv(&b, &st);
	ck_assert_uint_eq(st.clock_back, 2);
	tap_buf_deinit(&b);
}
END_TEST

START_TEST(pcapng_interfaces_and_resolutions)
{
	size_t n = basic_conv(false, true);
	for (int swap = 0; swap < 2; swap++) {
		struct tap_buf b;
		tap_buf_init(&b);
		ng_shb(&b, swap);
		ng_idb(&b, 1, 0, swap);     /* default µs */
		ng_idb(&b, 101, 0x09, swap); /* ns */
		ng_idb(&b, 113, 0x94, swap); /* 2^-20 s */
		static uint8_t frame[70100];
		for (size_t i = 0; i < n; i++) {
			uint32_t ifid = (uint32_t)(i % 3);
			static const uint32_t lt[] = {1, 101, 113};
			size_t len = link_wrap(frame, lt[ifid], pk[i].data, pk[i].len, false, ifid == 0);
			uint64_t units = (uint64_t)pk[i].ts;
			if (ifid == 1)
				units *= 1000;
			else if (ifid == 2)
				units = (uint64_t)(((unsigned __int128)(uint64_t)pk[i].ts << 20) / 1000000) + 1;
			ng_epb(&b, ifid, units, frame, len, swap);
		}
		struct got g;
		char err[256] = "";
		ck_assert_msg(run_mem(b.data, b.len, 5672, &g, err, sizeof err) == 0, "%s", err);
		check_basic(&g, false);
		got_free(&g);
		tap_buf_deinit(&b);
	}
}
END_TEST

static int run_pkts(size_t n, const size_t *order, struct got *g)
{
	struct tap_buf b;
	tap_buf_init(&b);
	static struct pkt tmp[MAX_PKTS];
	for (size_t i = 0; i < n; i++)
		tmp[i] = pk[order ? order[i] : i];
	write_pcap(&b, tmp, n, 101, false, false, false);
	char err[256] = "";
	int rc = run_mem(b.data, b.len, 5672, g, err, sizeof err);
	tap_buf_deinit(&b);
	return rc;
}

/* Ethernet frames, packet i cut to caplen[i] bytes by the snap length (0: captured whole): a classic pcap, or (push)
 * handed over one by one with their length on the wire, as `amqptap sniff` does. */
static int run_cut(size_t n, const size_t *order, const size_t *caplen, bool v6, bool push, struct got *g,
		   struct tap_capture_stats *st)
{
	struct tap_buf b;
	tap_buf_init(&b);
	write_pcap(&b, pk, 0, 1, false, false, v6); /* the file header */
	memset(g, 0, sizeof *g);
	struct tap_capture_cb cb = {.ctx = g, .packet = g_packet, .open = g_open, .data = g_data, .gap = g_gap,
				    .close = g_close};
	struct tap_capture *c = NULL;
	if (push)
		ck_assert_int_eq(tap_capture_new_push(&c, 5672, &cb), 0);
	static uint8_t frame[70100];
	for (size_t k = 0; k < n; k++) {
		size_t i = order ? order[k] : k;
		size_t len = link_wrap(frame, 1, pk[i].data, pk[i].len, v6, false);
		size_t cap = caplen[i] && caplen[i] < len ? caplen[i] : len;
		if (push) {
			ck_assert_int_eq(tap_capture_push(c, 1, pk[i].ts, frame, cap, len), 0);
			continue;
		}
		put32le(&b, (uint32_t)(pk[i].ts / 1000000), false);
		put32le(&b, (uint32_t)(pk[i].ts % 1000000), false);
		put32le(&b, (uint32_t)cap, false);
		put32le(&b, (uint32_t)len, false);
		tap_buf_append(&b, frame, cap);
	}
	int rc = 0;
	if (push) {
		tap_capture_end_all(c);
		tap_capture_get_stats(c, st);
		tap_capture_free(c);
	} else {
		char err[256] = "";
		rc = run_mem_limits(b.data, b.len, 5672, g, 0, 0, st, err, sizeof err);
	}
	tap_buf_deinit(&b);
	return rc;
}

/* A packet the snap length cut (tcpdump -s 96) delivers the payload bytes it holds, in order; only the bytes cut off
 * are a gap, and the next segment follows them in sequence space. So a publish whose method frame is in the captured
 * prefix is still decoded. Out of order the same. A cut inside the TCP header leaves nothing of the payload known:
 * the whole of it is the gap. IPv4 and IPv6; from a file and pushed (sniff: it once passed only the captured length,
 * so a cut packet looked whole and the next segment's bytes were taken as following it). */
START_TEST(snap_length_keeps_the_captured_prefix)
{
	for (int n = 0; n < 4; n++) {
		int v6 = n & 1, push = n >> 1;
		size_t hdr = 14 + (v6 ? 40 : 20) + 20; /* Ethernet, IP, TCP */
		for (int swapped = 0; swapped < 2; swapped++) {
			struct conv v;
			conv_init(&v, v6, 40009, 5672, pk);
			conv_open(&v);                                             /* 0 1 2 */
			conv_send(&v, true, F_PSH | F_ACK, "0123456789abcdef", 16); /* 3: cut after 6 payload bytes */
			conv_send(&v, true, F_PSH | F_ACK, "next", 4);             /* 4 */
			conv_send(&v, false, F_PSH | F_ACK, "ok", 2);              /* 5 */
			conv_close(&v);                                            /* 6 7 8 9 */
			size_t caplen[MAX_PKTS] = {0};
			caplen[3] = hdr + 6;
			size_t order[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, swap[] = {0, 1, 2, 4, 3, 5, 6, 7, 8, 9};
			struct got g;
			struct tap_capture_stats st;
			ck_assert_int_eq(run_cut(10, swapped ? swap : order, caplen, v6, push, &g, &st), 0);
			ck_assert_uint_eq(g.n, 1);
			assert_bytes(&g.s[0].bytes[TAP_C2S], "012345next");
			assert_bytes(&g.s[0].bytes[TAP_S2C], "ok");
			ck_assert_uint_eq(g.s[0].gaps, 1);
			ck_assert_uint_eq(g.s[0].missing[TAP_C2S], 10);
			ck_assert_int_eq(g.s[0].how, TAP_CAPTURE_END_CLIENT_FIN);
			ck_assert_uint_eq(st.cut_short, 1);
			ck_assert_uint_eq(st.skipped, 0);
			got_free(&g);

			caplen[3] = hdr - 1; /* the TCP header cut: the packet tells nothing */
			ck_assert_int_eq(run_cut(10, swapped ? swap : order, caplen, v6, push, &g, &st), 0);
			assert_bytes(&g.s[0].bytes[TAP_C2S], "next");
			ck_assert_uint_eq(g.s[0].missing[TAP_C2S], 16);
			ck_assert_uint_eq(st.skipped, 1);
			got_free(&g);
		}
	}
}
END_TEST

START_TEST(out_of_order_retransmit_overlap)
{
	struct conv v;
	conv_init(&v, false, 40001, 5672, pk);
	conv_open(&v);                                     /* 0 1 2 */
	uint32_t base = v.cseq;
	conv_send(&v, true, F_PSH | F_ACK, "aaaa", 4);     /* 3 */
	conv_send(&v, true, F_PSH | F_ACK, "bbbb", 4);     /* 4 */
	conv_send(&v, true, F_PSH | F_ACK, "cccc", 4);     /* 5 */
	conv_raw(&v, true, base + 4, F_PSH | F_ACK, "bbbb", 4);    /* 6: exact retransmission */
	conv_raw(&v, true, base + 2, F_PSH | F_ACK, "aabbbbcc", 8); /* 7: overlap, nothing new */
	conv_raw(&v, true, base + 10, F_PSH | F_ACK, "ccdd", 4);    /* 8: overlap with 2 new bytes */
	conv_send(&v, false, F_PSH | F_ACK, "xy", 2);      /* 9 */
	conv_close(&v);                                    /* 10..13 */
	v.cseq += 2;
	/* deliver 5 before 4 before 3, 8 before its predecessor, and 9 twice */
	size_t order[] = {0, 1, 2, 5, 4, 6, 3, 7, 8, 9, 9, 10, 11, 12, 13};
	/* the FIN (10) was built with cseq before the two extra bytes; rebuild it at the right seq */
	v.n = 10;
	v.cseq = base + 14;
	v.sseq--; /* the first build counted the server's FIN */
	conv_close(&v);
	struct got g;
	ck_assert_int_eq(run_pkts(sizeof order / sizeof order[0], order, &g), 0);
	ck_assert_uint_eq(g.n, 1);
	assert_bytes(&g.s[0].bytes[TAP_C2S], "aaaabbbbccccdd");
	assert_bytes(&g.s[0].bytes[TAP_S2C], "xy");
	ck_assert(g.s[0].closed);
	ck_assert_int_eq(g.s[0].how, TAP_CAPTURE_END_CLIENT_FIN);
	ck_assert_uint_eq(g.s[0].gaps, 0);
	/* 'bbbb' and 'cccc' became deliverable when 'aaaa' (packet 3, the 7th record) arrived */
	ck_assert_int_eq(g.s[0].first_ts[TAP_C2S], pk[3].ts);
	got_free(&g);
}
END_TEST

START_TEST(mid_connection_start)
{
	struct conv v;
	conv_init(&v, false, 40002, 5672, pk);
	conv_open(&v);
	conv_send(&v, true, F_PSH | F_ACK, "lost", 4);
	conv_send(&v, false, F_ACK, NULL, 0);
	conv_send(&v, true, F_PSH | F_ACK, "seen", 4);
	conv_send(&v, false, F_PSH | F_ACK, "back", 4);
	conv_send(&v, true, F_RST | F_ACK, NULL, 0);
	struct got g;
	size_t order[] = {4, 5, 6, 7}; /* starts with a pure ACK, which must not open a stream */
	ck_assert_int_eq(run_pkts(4, order, &g), 0);
	ck_assert_uint_eq(g.n, 1);
	ck_assert(g.s[0].midstream);
	assert_bytes(&g.s[0].bytes[TAP_C2S], "seen");
	assert_bytes(&g.s[0].bytes[TAP_S2C], "back");
	ck_assert_int_eq(g.s[0].how, TAP_CAPTURE_END_CLIENT_RST);
	got_free(&g);
}
END_TEST

/* A new connection on the 4-tuple of one whose end the capture lost (its FIN dropped, or picked up mid-stream):
 * the client's SYN with another sequence number ends the old stream where the capture lost it and opens a new
 * one, whose bytes are all delivered. A SYN retransmitted with the same number opens nothing. Both when the new
 * ISN lies below the old stream's bytes (they looked like retransmissions) and far above them (a hole). */
START_TEST(reused_four_tuple_after_a_lost_end)
{
	const uint32_t isns[] = {10, 5000000};
	for (size_t k = 0; k < 2; k++) {
		struct conv v;
		conv_init(&v, false, 40010, 5672, pk);
		v.cseq = 1000;
		conv_open(&v);
		conv_send(&v, true, F_PSH | F_ACK, "first", 5);
		conv_send(&v, true, F_FIN | F_ACK, NULL, 0); /* the broker's FIN is lost */
		v.cseq = isns[k];
		conv_open(&v);
		conv_raw(&v, true, isns[k], F_SYN, NULL, 0); /* retransmitted SYN */
		conv_send(&v, true, F_PSH | F_ACK, "second", 6);
		conv_close(&v);
		struct got g;
		ck_assert_int_eq(run_pkts(v.n, NULL, &g), 0);
		ck_assert_uint_eq(g.n, 2);
		assert_bytes(&g.s[0].bytes[TAP_C2S], "first");
		assert_bytes(&g.s[1].bytes[TAP_C2S], "second");
		ck_assert_uint_eq(g.s[0].gaps + g.s[1].gaps, 0);
		ck_assert(!g.s[1].midstream);
		ck_assert_int_eq(g.s[1].how, TAP_CAPTURE_END_CLIENT_FIN);
		got_free(&g);
	}
}
END_TEST

START_TEST(reset_by_server_and_capture_end_and_port_filter)
{
	struct conv a, b2;
	static struct pkt pb[32];
	conv_init(&a, false, 40003, 5672, pk);
	conv_open(&a);
	conv_send(&a, true, F_PSH | F_ACK, "one", 3);
	conv_send(&a, false, F_RST, NULL, 0);
	conv_send(&a, true, F_PSH | F_ACK, "late", 4); /* after the reset: ignored */
	conv_init(&b2, false, 40004, 5672, pb);
	conv_open(&b2);
	conv_send(&b2, true, F_PSH | F_ACK, "two", 3);
	conv_send(&b2, true, F_FIN | F_ACK, NULL, 0); /* half-closed at the end of the capture */
	conv_init(&b2, false, 40005, 80, pb + b2.n);    /* another port: ignored */
	conv_open(&b2);
	size_t nb = 5 + 3;
	for (size_t i = 0; i < nb; i++)
		pk[a.n + i] = pb[i];
	struct got g;
	ck_assert_int_eq(run_pkts(a.n + nb, NULL, &g), 0);
	ck_assert_uint_eq(g.n, 2);
	assert_bytes(&g.s[0].bytes[TAP_C2S], "one");
	ck_assert_int_eq(g.s[0].how, TAP_CAPTURE_END_SERVER_RST);
	assert_bytes(&g.s[1].bytes[TAP_C2S], "two");
	ck_assert_uint_eq(g.s[1].id, 2);
	ck_assert_int_eq(g.s[1].how, TAP_CAPTURE_END_CLIENT_FIN);
	got_free(&g);
}
END_TEST

/* Several broker ports (tap_capture_add_port): streams of each are followed, others ignored; the push API (sniff)
 * gives the same streams as reading the file. */
START_TEST(several_ports)
{
	struct conv v;
	size_t n = 0;
	const uint16_t ports[] = {5672, 5673, 80};
	for (size_t i = 0; i < 3; i++) {
		conv_init(&v, i == 1, (uint16_t)(40010 + i), ports[i], pk + n);
		conv_open(&v);
		conv_send(&v, true, F_PSH | F_ACK, i == 0 ? "a" : i == 1 ? "bb" : "ccc", i + 1);
		conv_close(&v);
		n += v.n;
	}
	struct tap_buf b;
	tap_buf_init(&b);
	write_pcap(&b, pk, n, 101, false, false, false);
	for (int push = 0; push < 2; push++) {
		for (int both = 0; both < 2; both++) {
			struct got g;
			memset(&g, 0, sizeof g);
			struct tap_capture_cb cb = {.ctx = &g, .open = g_open, .data = g_data, .gap = g_gap, .close = g_close};
			struct tap_capture *c;
			char err[256] = "";
			if (push) {
				ck_assert_int_eq(tap_capture_new_push(&c, 5672, &cb), 0);
			} else {
				ck_assert_int_eq(tap_capture_open_mem(&c, b.data, b.len, "mem", err, sizeof err), 0);
			}
			if (both)
				ck_assert_int_eq(tap_capture_add_port(c, 5673), 0);
			if (push) {
				for (size_t i = 0; i < n; i++)
					ck_assert_int_eq(tap_capture_push(c, 101, pk[i].ts, pk[i].data, pk[i].len, pk[i].len), 0);
				tap_capture_end_all(c);
			} else {
				ck_assert_int_eq(tap_capture_run(c, 5672, &cb, err, sizeof err), 0);
			}
			tap_capture_free(c);
			ck_assert_uint_eq(g.n, both ? 2 : 1);
			assert_bytes(&g.s[0].bytes[TAP_C2S], "a");
			ck_assert_str_eq(g.s[0].server, "10.0.0.2:5672");
			if (both) {
				assert_bytes(&g.s[1].bytes[TAP_C2S], "bb");
				ck_assert_int_eq(g.s[1].how, TAP_CAPTURE_END_CLIENT_FIN);
				ck_assert(strstr(g.s[1].server, ":5673") != NULL);
			}
			got_free(&g);
		}
	}
	struct tap_capture *c;
	ck_assert_int_eq(tap_capture_new_push(&c, 1, NULL), 0);
	for (uint16_t i = 2; i <= TAP_CAPTURE_MAX_PORTS; i++)
		ck_assert_int_eq(tap_capture_add_port(c, i), 0);
	ck_assert_int_eq(tap_capture_add_port(c, 99), TAP_E_USAGE);
	tap_capture_free(c);
	tap_buf_deinit(&b);
}
END_TEST

START_TEST(out_of_order_bound_gives_a_gap)
{
	struct conv v;
	conv_init(&v, false, 40006, 5672, pk);
	conv_open(&v);
	static char big[60000];
	memset(big, 'z', sizeof big);
	conv_send(&v, true, F_PSH | F_ACK, "hole", 4); /* 3: never delivered */
	for (int i = 0; i < 40; i++)                     /* 2.4 MB ... */
		conv_send(&v, true, F_ACK, big, sizeof big);
	size_t order[MAX_PKTS];
	size_t n = 0;
	for (size_t i = 0; i < v.n; i++)
		if (i != 3)
			order[n++] = i;
	struct got g;
	ck_assert_int_eq(run_pkts(n, order, &g), 0);
	/* 2.4 MB fits the 4 MB bound: buffered until the stream ends, then the hole is given up and the rest
	 * delivered after it */
	ck_assert_uint_eq(g.s[0].gaps, 1);
	ck_assert_uint_eq(g.s[0].bytes[TAP_C2S].len, 40u * sizeof big);
	got_free(&g);
	for (int i = 0; i < 40; i++) /* ... 4.8 MB exceeds the bound: the hole is given up */
		conv_send(&v, true, F_ACK, big, sizeof big);
	n = 0;
	for (size_t i = 0; i < v.n; i++)
		if (i != 3)
			order[n++] = i;
	ck_assert_int_eq(run_pkts(n, order, &g), 0);
	ck_assert_uint_eq(g.s[0].gaps, 1);
	ck_assert_uint_eq(g.s[0].bytes[TAP_C2S].len, 80u * sizeof big);
	got_free(&g);
}
END_TEST

/* A segment the peer acknowledged but the capture lost (tcpdump drops, issue 15) is given up on when the ack is
 * seen, before the acking packet's own data, and a FIN buffered behind a hole at a reset still ends the stream as
 * a FIN: the reset answered it. */
/* Out-of-order segments are bounded in all streams together, not only per direction: 20 streams seen one way
 * only (nothing acknowledges their bytes), each missing its first segment and then sending 4 MiB, would hold
 * 80 MiB. The reassembler never holds more than TAP_CAPTURE_MAX_OOO_TOTAL: the least recently active stream
 * gives up its hole (a gap) and its bytes are delivered. */
static uint64_t ooo_delivered, ooo_gaps;

static void ooo_data(void *ctx, void *user, enum tap_dir dir, const uint8_t *data, size_t len, int64_t ts)
{
	(void)ctx, (void)user, (void)dir, (void)data, (void)ts;
	ooo_delivered += len;
}

static void ooo_gap(void *ctx, void *user, enum tap_dir dir, uint64_t missing, int64_t ts)
{
	(void)ctx, (void)user, (void)dir, (void)missing, (void)ts;
	ooo_gaps++;
}

START_TEST(out_of_order_bound_over_all_streams)
{
	static uint8_t chunk[65536];
	struct tap_capture_stats st = {0};
	struct tap_capture_cb cb = {.data = ooo_data, .gap = ooo_gap};
	struct tap_reasm r;
	tap_reasm_init(&r, &st);
	r.ports[0] = 5672;
	r.n_ports = 1;
	r.cb = &cb;
	r.idle_us = TAP_CAPTURE_IDLE_US_DEFAULT;
	r.max_streams = TAP_CAPTURE_MAX_STREAMS_DEFAULT;
	ooo_delivered = ooo_gaps = 0;
	const unsigned streams = 20, per_stream = (4u << 20) / sizeof chunk;
	size_t peak = 0;
	for (unsigned k = 0; k < per_stream; k++) {
		for (unsigned i = 0; i < streams; i++) {
			/* a byte at 1000 starts the stream mid-way; the chunk after it is never captured */
			struct tap_segment g = {.sport = (uint16_t)(40000 + i), .dport = 5672, .flags = 0x18,
						.payload = chunk, .len = k ? sizeof chunk : 1};
			memcpy(g.src, "\x0a\x00\x00\x01", 4);
			memcpy(g.dst, "\x0a\x00\x00\x02", 4);
			g.seq = k ? 1001 + (uint32_t)k * (uint32_t)sizeof chunk : 1000;
			ck_assert_int_eq(tap_reasm_segment(&r, &g, 1000 + k * streams + i), 0);
			if (r.ooo_held > peak)
				peak = r.ooo_held;
		}
	}
	ck_assert_uint_le(peak, TAP_CAPTURE_MAX_OOO_TOTAL);
	ck_assert_uint_gt(peak, TAP_CAPTURE_MAX_OOO_TOTAL / 2);
	ck_assert_uint_gt(ooo_gaps, 0);
	ck_assert_uint_gt(ooo_delivered, 0);
	tap_reasm_close_all(&r, 1000000);
	ck_assert_uint_eq(r.ooo_held, 0);
	ck_assert_uint_eq(ooo_delivered, (uint64_t)streams * (1 + (per_stream - 1) * sizeof chunk));
	tap_reasm_deinit(&r);
}
END_TEST

START_TEST(acked_hole_is_given_up_at_once)
{
	struct conv v;
	conv_init(&v, false, 40007, 5672, pk);
	conv_open(&v);                                    /* 0 1 2 */
	conv_send(&v, true, F_PSH | F_ACK, "lost", 4);    /* 3: not captured */
	conv_send(&v, true, F_PSH | F_ACK, "kept", 4);    /* 4 */
	conv_send(&v, false, F_PSH | F_ACK, "ok", 2);     /* 5: acks both */
	conv_send(&v, true, F_PSH | F_ACK, "more", 4);    /* 6 */
	size_t order[] = {0, 1, 2, 4, 5, 6};
	struct got g;
	ck_assert_int_eq(run_pkts(6, order, &g), 0);
	ck_assert_uint_eq(g.s[0].gaps, 1);
	assert_bytes(&g.s[0].bytes[TAP_C2S], "keptmore");
	ck_assert_int_eq(g.s[0].first_ts[TAP_C2S], pk[5].ts);
	ck_assert_int_eq(g.s[0].first_ts[TAP_S2C], pk[5].ts);
	got_free(&g);

	conv_init(&v, false, 40008, 5672, pk);
	conv_open(&v);                                    /* 0 1 2 */
	conv_send(&v, true, F_PSH | F_ACK, "lost", 4);    /* 3: not captured */
	conv_send(&v, true, F_FIN | F_ACK, NULL, 0);      /* 4: buffered behind the hole */
	conv_send(&v, false, F_RST, NULL, 0);             /* 5 */
	size_t order2[] = {0, 1, 2, 4, 5};
	ck_assert_int_eq(run_pkts(5, order2, &g), 0);
	ck_assert_uint_eq(g.s[0].gaps, 1);
	ck_assert_int_eq(g.s[0].how, TAP_CAPTURE_END_CLIENT_FIN);
	got_free(&g);
}
END_TEST

/* A capture merged from two one-direction taps whose clocks differ: the client's ACK of the broker's segment comes
 * 20 µs before that segment. Bytes acknowledged and not yet captured are awaited for TAP_CAPTURE_REORDER_US, so
 * that is no gap (it made one, and every later publish `unknown`); a segment later than that is one. */
START_TEST(ack_before_the_data_it_acknowledges)
{
	const int64_t late[] = {20, TAP_CAPTURE_REORDER_US - 1, TAP_CAPTURE_REORDER_US, 20 * 1000};
	for (size_t k = 0; k < sizeof late / sizeof late[0]; k++) {
		struct conv v;
		conv_init(&v, false, 40010, 5672, pk);
		conv_open(&v);                                  /* 0 1 2 */
		conv_send(&v, false, F_PSH | F_ACK, "hello", 5); /* 3 */
		conv_send(&v, true, F_ACK, NULL, 0);            /* 4: acks it, captured first */
		v.ts += 30 * 1000;
		conv_send(&v, true, F_PSH | F_ACK, "more", 4);  /* 5 */
		conv_close(&v);                                 /* 6 7 8 9 */
		pk[4].ts = pk[3].ts;
		pk[3].ts += late[k];
		size_t order[] = {0, 1, 2, 4, 3, 5, 6, 7, 8, 9};
		struct got g;
		ck_assert_int_eq(run_pkts(10, order, &g), 0);
		bool gap = late[k] >= TAP_CAPTURE_REORDER_US;
		ck_assert_uint_eq(g.s[0].gaps, gap);
		assert_bytes(&g.s[0].bytes[TAP_S2C], gap ? "" : "hello");
		assert_bytes(&g.s[0].bytes[TAP_C2S], "more");
		if (gap) { /* at the packet that moved the clock past the allowance, before its own bytes */
			ck_assert_uint_eq(g.s[0].missing[TAP_S2C], 5);
			ck_assert_int_eq(g.s[0].gap_ts, pk[3].ts);
		}
		got_free(&g);
	}
}
END_TEST

static int64_t wait_gap_ts;
static uint64_t wait_gaps, wait_missing;

static void wait_gap(void *ctx, void *user, enum tap_dir dir, uint64_t missing, int64_t ts)
{
	(void)ctx, (void)user, (void)dir;
	wait_gaps++;
	wait_missing += missing;
	wait_gap_ts = ts;
}

static void wait_segment(struct tap_reasm *r, bool c2s, uint32_t seq, uint32_t ack, uint8_t flags, const char *data,
			 int64_t ts)
{
	struct tap_segment g = {.sport = c2s ? 40011 : 5672, .dport = c2s ? 5672 : 40011, .seq = seq, .ack = ack,
				.flags = flags, .payload = (const uint8_t *)data, .len = data ? strlen(data) : 0};
	memcpy(c2s ? g.src : g.dst, "\x0a\x00\x00\x01", 4);
	memcpy(c2s ? g.dst : g.src, "\x0a\x00\x00\x02", 4);
	tap_reasm_packet_time(r, ts);
	ck_assert_int_eq(tap_reasm_segment(r, &g, ts), 0);
}

/* Bytes the client acknowledged that the capture never had (a Return it lost), acknowledged after 3 s of silence:
 * while they are awaited, what is known ends before the broker's last segment (the lost bytes came after it), so the
 * replay settles no deadline past it; once the allowance is over they are a gap, which a packet of the direction
 * beyond them shows at once too. */
START_TEST(acked_bytes_never_captured_are_a_gap_after_the_allowance)
{
	struct tap_capture_stats st = {0};
	struct tap_capture_cb cb = {.gap = wait_gap};
	for (int beyond = 0; beyond < 2; beyond++) {
		struct tap_reasm r;
		tap_reasm_init(&r, &st);
		r.ports[0] = 5672;
		r.cb = &cb;
		r.idle_us = TAP_CAPTURE_IDLE_US_DEFAULT;
		r.max_streams = TAP_CAPTURE_MAX_STREAMS_DEFAULT;
		wait_gaps = wait_missing = 0;
		const int64_t t = 1700000000000000;
		wait_segment(&r, true, 100, 0, F_SYN, NULL, t);
		wait_segment(&r, false, 1000, 101, F_SYN | F_ACK, NULL, t + 10);
		wait_segment(&r, true, 101, 1001, F_ACK, NULL, t + 20);
		wait_segment(&r, false, 1001, 101, F_PSH | F_ACK, "abcd", t + 1000); /* the broker's last, captured */
		ck_assert_int_eq(tap_reasm_known_until(&r), INT64_MAX);
		/* [1005, 1013) sent and lost by the capture; acknowledged 3 s later */
		const int64_t ack_at = t + 3000000;
		wait_segment(&r, true, 101, 1013, F_ACK, NULL, ack_at);
		ck_assert_uint_eq(wait_gaps, 0);
		ck_assert_int_eq(tap_reasm_known_until(&r), t + 1000 - 1);
		if (beyond) { /* the broker's next segment, after the lost bytes: they are lost */
			wait_segment(&r, false, 1013, 101, F_PSH | F_ACK, "next", ack_at + 50);
			ck_assert_uint_eq(wait_gaps, 1);
			ck_assert_int_eq(wait_gap_ts, ack_at + 50);
		} else {
			tap_reasm_expire(&r, ack_at + TAP_CAPTURE_REORDER_US - 1);
			ck_assert_uint_eq(wait_gaps, 0);
			tap_reasm_expire(&r, ack_at + TAP_CAPTURE_REORDER_US);
			ck_assert_uint_eq(wait_gaps, 1);
			ck_assert_int_eq(wait_gap_ts, ack_at + TAP_CAPTURE_REORDER_US);
		}
		ck_assert_uint_eq(wait_missing, 8);
		ck_assert_int_eq(tap_reasm_known_until(&r), INT64_MAX);
		tap_reasm_close_all(&r, ack_at + 1000000);
		ck_assert_uint_eq(wait_gaps, 1);
		tap_reasm_deinit(&r);
	}
}
END_TEST

START_TEST(truncated_file_keeps_earlier_streams)
{
	size_t n = basic_conv(false, false);
	struct tap_buf b;
	tap_buf_init(&b);
	write_pcap(&b, pk, n, 1, false, false, false);
	size_t whole = b.len;
	struct conv v;
	conv_init(&v, false, 40007, 5672, pk);
	conv_open(&v);
	conv_send(&v, true, F_PSH | F_ACK, "partial", 7);
	struct tap_buf b2;
	tap_buf_init(&b2);
	write_pcap(&b2, pk, v.n, 1, false, false, false);
	tap_buf_append(&b, b2.data + 24, b2.len - 24 - 5); /* the last record loses 5 bytes */
	size_t last_rec = b.len - (16 + 14 + 20 + 20 + 7 - 5);
	struct got g;
	char err[256] = "";
	ck_assert_int_eq(run_mem(b.data, b.len, 5672, &g, err, sizeof err), TAP_E_BAD_CAPTURE);
	char want[64];
	snprintf(want, sizeof want, "truncated record at offset %zu", last_rec);
	ck_assert_msg(strstr(err, want) && strstr(err, "mem.cap"), "%s (want %s)", err, want);
	ck_assert_uint_eq(g.n, 2);
	check_stream(&g.s[0], false);
	ck_assert(g.s[1].closed);
	ck_assert_int_eq(g.s[1].how, TAP_CAPTURE_END_CAPTURE);
	got_free(&g);
	(void)whole;
	/* cut inside a record header */
	ck_assert_int_eq(run_mem(b.data, whole + 10, 5672, &g, err, sizeof err), TAP_E_BAD_CAPTURE);
	snprintf(want, sizeof want, "truncated record header at offset %zu", whole);
	ck_assert_msg(strstr(err, want), "%s", err);
	got_free(&g);
	tap_buf_deinit(&b);
	tap_buf_deinit(&b2);
}
END_TEST

START_TEST(corrupt_pcapng_block_length)
{
	size_t n = basic_conv(true, false);
	struct tap_buf b;
	tap_buf_init(&b);
	ng_shb(&b, false);
	ng_idb(&b, 229, 0, false);
	for (size_t i = 0; i < n; i++)
		ng_epb(&b, 0, (uint64_t)pk[i].ts, pk[i].data, pk[i].len, false);
	size_t at = b.len;
	ng_epb(&b, 0, 1, pk[0].data, pk[0].len, false);
	struct got g;
	char err[256] = "";
	uint32_t bad = 13; /* not a multiple of 4 */
	memcpy(b.data + at + 4, &bad, 4);
	ck_assert_int_eq(run_mem(b.data, b.len, 5672, &g, err, sizeof err), TAP_E_BAD_CAPTURE);
	char want[64];
	snprintf(want, sizeof want, "corrupt block length 13 at offset %zu", at);
	ck_assert_msg(strstr(err, want), "%s", err);
	check_basic(&g, true);
	got_free(&g);
	bad = 0x7FFFFFF0; /* huge */
	memcpy(b.data + at + 4, &bad, 4);
	ck_assert_int_eq(run_mem(b.data, b.len, 5672, &g, err, sizeof err), TAP_E_BAD_CAPTURE);
	got_free(&g);
	bad = 64; /* trailer mismatch */
	memcpy(b.data + at + 4, &bad, 4);
	ck_assert_int_eq(run_mem(b.data, b.len, 5672, &g, err, sizeof err), TAP_E_BAD_CAPTURE);
	ck_assert_msg(strstr(err, "offset"), "%s", err);
	got_free(&g);
	/* not a capture at all */
	struct tap_capture *c;
	ck_assert_int_eq(tap_capture_open_mem(&c, "hello world, not pcap", 21, "x", err, sizeof err),
			 TAP_E_BAD_CAPTURE);
	ck_assert_ptr_null(c);
	tap_buf_deinit(&b);
}
END_TEST

/* tests/data/capture/loopback-amqp.pcapng: tshark -i lo of scripts' Python peers (see README there). */
START_TEST(real_loopback_capture)
{
	char path[512], exp[512];
	snprintf(path, sizeof path, "%s/tests/data/capture/loopback-amqp.pcapng", TAP_SOURCE_DIR);
	snprintf(exp, sizeof exp, "%s/tests/data/capture/loopback-amqp.streams", TAP_SOURCE_DIR);
	struct got g;
	memset(&g, 0, sizeof g);
	struct tap_capture_cb cb = {.ctx = &g, .packet = g_packet, .open = g_open, .data = g_data, .gap = g_gap,
				    .close = g_close};
	struct tap_capture *c;
	char err[256] = "";
	struct tap_buf file;
	tap_file_slurp(path, &file);
	ck_assert_msg(tap_capture_open_mem(&c, file.data, file.len, path, err, sizeof err) == 0, "%s", err);
	ck_assert_msg(tap_capture_run(c, 5699, &cb, err, sizeof err) == 0, "%s", err);
	struct tap_capture_stats st;
	tap_capture_get_stats(c, &st);
	tap_capture_free(c);
	tap_buf_deinit(&file);
	/* expected: one line per stream: "<c2s bytes> <s2c bytes> <fnv1a64 c2s> <fnv1a64 s2c> <how>" */
	FILE *f = fopen(exp, "r");
	ck_assert_ptr_nonnull(f);
	size_t i = 0;
	unsigned long long cl, sl, ch, sh;
	int how;
	while (fscanf(f, "%llu %llu %llx %llx %d", &cl, &sl, &ch, &sh, &how) == 5) {
		ck_assert_uint_lt(i, g.n);
		const struct got_stream *s = &g.s[i];
		ck_assert_uint_eq(s->bytes[TAP_C2S].len, cl);
		ck_assert_uint_eq(s->bytes[TAP_S2C].len, sl);
		for (int d = 0; d < 2; d++) {
			uint64_t h = 1469598103934665603ull;
			for (size_t k = 0; k < s->bytes[d].len; k++)
				h = (h ^ (uint8_t)s->bytes[d].data[k]) * 1099511628211ull;
			ck_assert_uint_eq(h, d ? ch : sh);
		}
		ck_assert_int_eq(s->how, how);
		ck_assert(!s->midstream);
		ck_assert(memcmp(s->bytes[TAP_C2S].data, "AMQP\0\0\x09\x01", 8) == 0);
		i++;
	}
	fclose(f);
	ck_assert_uint_eq(i, g.n);
	ck_assert_uint_ge(g.n, 2);
	got_free(&g);
}
END_TEST

/* A SYN flood beside an idle live connection (room for two streams): every SYN-only stream goes before the
 * connection that spoke, however long ago it spoke, and none is reported; a handshake that carries nothing is
 * dropped TAP_CAPTURE_QUIET_IDLE_US after its last packet, while the live one, silent as long, stays. */
START_TEST(quiet_streams_go_first)
{
	static struct pkt all[64];
	struct pkt tmp[8];
	size_t n = 0;
	const int64_t t0 = 1700000000000000, ms = 1000;
	struct conv live, syn[6];
	conv_init(&live, false, 40001, 5672, tmp);
	live.ts = t0;
	conv_open(&live);
	conv_send(&live, true, F_PSH | F_ACK, "AMQP\0\0\x09\x01", 8);
	for (size_t k = 0; k < live.n; k++)
		all[n++] = tmp[k];
	for (int i = 0; i < 6; i++) { /* SYNs only, 1 ms apart, the last a full handshake */
		conv_init(&syn[i], false, (uint16_t)(50001 + i), 5672, tmp);
		syn[i].ts = t0 + (10 + i) * ms;
		if (i < 5)
			conv_send(&syn[i], true, F_SYN, NULL, 0);
		else
			conv_open(&syn[i]);
		for (size_t k = 0; k < syn[i].n; k++)
			all[n++] = tmp[k];
	}
	live.pkts = tmp;
	live.n = 0;
	live.ts = t0 + 20 * ms; /* the live one speaks on, in the same stream */
	conv_send(&live, true, F_PSH | F_ACK, "more", 4);
	live.ts = t0 + 20 * ms + TAP_CAPTURE_QUIET_IDLE_US; /* and again once the handshake has been quiet too long */
	conv_send(&live, true, F_PSH | F_ACK, "late", 4);
	for (size_t k = 0; k < live.n; k++)
		all[n++] = tmp[k];
	struct tap_buf buf;
	tap_buf_init(&buf);
	write_pcap(&buf, all, n, 101, false, false, false);
	struct got g;
	struct tap_capture_stats st;
	char err[256] = "";
	ck_assert_msg(run_mem_limits(buf.data, buf.len, 5672, &g, 3600 * 1000 * ms, 2, &st, err, sizeof err) == 0,
		      "%s", err);
	ck_assert_uint_eq(g.n, 1);
	ck_assert(!g.s[0].midstream);
	ck_assert_int_eq(g.s[0].how, TAP_CAPTURE_END_CAPTURE);
	ck_assert_uint_eq(g.s[0].bytes[TAP_C2S].len, 16);
	ck_assert(memcmp(g.s[0].bytes[TAP_C2S].data + 8, "morelate", 8) == 0);
	ck_assert_uint_eq(st.evicted, 0);
	ck_assert_uint_eq(st.idle_closed, 0);
	ck_assert_uint_eq(st.quiet_dropped, 6); /* five for room, the handshake for quiet time */
	ck_assert_uint_eq(st.streams, 7);
	got_free(&g);
	tap_buf_deinit(&buf);
}
END_TEST

/* Streams are bounded: with room for two open, a third one closes the least recently active (_END_LIMIT);
 * streams silent for the idle time are closed (TAP_CAPTURE_END_IDLE), never reported as a reset or FIN, and a
 * later packet of one starts a new mid-stream stream. Closed streams are forgotten as well. */
START_TEST(stream_limit_and_idle_time)
{
	static struct pkt all[32];
	size_t n = 0;
	struct conv a, b, c, d;
	struct pkt tmp[8];
	const int64_t t0 = 1700000000000000, ms = 1000;
	struct conv *convs[] = {&a, &b, &c, &d};
	for (int i = 0; i < 4; i++) {
		conv_init(convs[i], false, (uint16_t)(40001 + i), 5672, tmp);
		convs[i]->ts = t0 + i * 10 * ms;
		if (i == 3)
			convs[i]->ts = t0 + 200 * ms;
		conv_open(convs[i]);
		if (i < 3)
			conv_send(convs[i], true, F_PSH | F_ACK, "AMQP\0\0\x09\x01", 8);
		for (size_t k = 0; k < convs[i]->n; k++)
			all[n++] = tmp[k];
		convs[i]->n = 0;
		if (i == 2) { /* A speaks again at 30 ms, after it was pushed out */
			a.ts = t0 + 30 * ms;
			a.pkts = tmp;
			conv_send(&a, true, F_PSH | F_ACK, "more", 4);
			all[n++] = tmp[0];
		}
	}
	struct tap_buf buf;
	tap_buf_init(&buf);
	write_pcap(&buf, all, n, 101, false, false, false);
	struct got g;
	struct tap_capture_stats st;
	char err[256] = "";
	ck_assert_msg(run_mem_limits(buf.data, buf.len, 5672, &g, 100 * ms, 2, &st, err, sizeof err) == 0, "%s", err);
	ck_assert_uint_eq(g.n, 5); /* A, B, C, A again (mid-stream), D */
	ck_assert_str_eq(g.s[0].client, "10.0.0.1:40001");
	ck_assert_int_eq(g.s[0].how, TAP_CAPTURE_END_LIMIT);
	ck_assert_int_eq(g.s[0].close_ts, t0 + 20 * ms);
	ck_assert_int_eq(g.s[1].how, TAP_CAPTURE_END_LIMIT); /* when A came back */
	ck_assert_int_eq(g.s[1].close_ts, t0 + 30 * ms);
	ck_assert_int_eq(g.s[2].how, TAP_CAPTURE_END_IDLE);
	ck_assert_int_eq(g.s[2].close_ts, t0 + 200 * ms);
	ck_assert_str_eq(g.s[3].client, "10.0.0.1:40001");
	ck_assert(g.s[3].midstream);
	assert_bytes(&g.s[3].bytes[TAP_C2S], "more");
	ck_assert_int_eq(g.s[3].how, TAP_CAPTURE_END_IDLE);
	ck_assert_int_eq(g.s[3].close_ts, t0 + 200 * ms);
	ck_assert_str_eq(g.s[4].client, "10.0.0.1:40004");
	ck_assert_int_eq(g.s[4].how, TAP_CAPTURE_END_CAPTURE);
	ck_assert_uint_eq(st.evicted, 2);
	ck_assert_uint_eq(st.idle_closed, 2);
	got_free(&g);
	/* the defaults close nothing early here */
	ck_assert(run_mem_limits(buf.data, buf.len, 5672, &g, 0, 0, &st, err, sizeof err) == 0);
	ck_assert_uint_eq(g.n, 4);
	ck_assert_uint_eq(st.evicted + st.idle_closed, 0);
	got_free(&g);
	/* a closed stream drops its late packets for the idle time, then it is forgotten */
	struct conv e;
	n = 0;
	conv_init(&e, false, 40009, 5672, tmp);
	conv_open(&e);
	conv_send(&e, true, F_PSH | F_ACK, "AMQP\0\0\x09\x01", 8);
	conv_close(&e);
	for (size_t k = 0; k < e.n; k++)
		all[n++] = tmp[k];
	for (int late = 0; late < 2; late++) {
		e.n = 0;
		e.ts = t0 + (late ? 500 : 50) * ms;
		conv_raw(&e, true, e.cseq - 9, F_PSH | F_ACK, "AMQP\0\0\x09\x01", 8); /* a retransmission */
		all[n++] = tmp[0];
	}
	tap_buf_reset(&buf);
	write_pcap(&buf, all, n, 101, false, false, false);
	ck_assert(run_mem_limits(buf.data, buf.len, 5672, &g, 100 * ms, 0, &st, err, sizeof err) == 0);
	ck_assert_uint_eq(g.n, 2);
	ck_assert_int_eq(g.s[0].how, TAP_CAPTURE_END_CLIENT_FIN);
	ck_assert(g.s[1].midstream);
	ck_assert_int_eq(g.s[1].open_ts, t0 + 500 * ms);
	got_free(&g);
	tap_buf_deinit(&buf);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("capture");
	TCase *tc = tcase_create("core");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, pcap_every_variant_and_link_type);
	tcase_add_test(tc, pcapng_interfaces_and_resolutions);
	tcase_add_test(tc, out_of_order_retransmit_overlap);
	tcase_add_test(tc, acked_hole_is_given_up_at_once);
	tcase_add_test(tc, snap_length_keeps_the_captured_prefix);
	tcase_add_test(tc, ack_before_the_data_it_acknowledges);
	tcase_add_test(tc, acked_bytes_never_captured_are_a_gap_after_the_allowance);
	tcase_add_test(tc, mid_connection_start);
	tcase_add_test(tc, pcapng_interfaces_with_clocks_apart);
	tcase_add_test(tc, clock_back_counts_packets);
	tcase_add_test(tc, pcapng_tsoffset_either_sign);
	tcase_add_test(tc, packets_the_reader_must_not_lose);
	tcase_add_test(tc, out_of_order_bound_over_all_streams);
	tcase_add_test(tc, reused_four_tuple_after_a_lost_end);
	tcase_add_test(tc, reset_by_server_and_capture_end_and_port_filter);
	tcase_add_test(tc, out_of_order_bound_gives_a_gap);
	tcase_add_test(tc, truncated_file_keeps_earlier_streams);
	tcase_add_test(tc, corrupt_pcapng_block_length);
	tcase_add_test(tc, real_loopback_capture);
	tcase_add_test(tc, stream_limit_and_idle_time);
	tcase_add_test(tc, quiet_streams_go_first);
	tcase_add_test(tc, several_ports);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
