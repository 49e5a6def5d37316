/* Capture reader: classic pcap (https://www.tcpdump.org/manpages/pcap-savefile.5.html) and pcapng
 * (draft-ietf-opsawg-pcapng §4), link layers per https://www.tcpdump.org/linktypes.html, IPv4 (RFC 791), IPv6
 * (RFC 8200 §4 extension headers), and TCP (RFC 9293 §3.4 sequence space) reassembled per direction. */
#include "amqptap/capture.h"

#include "amqptap/status.h"
#include "rd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#define PCAP_MAGIC_US 0xA1B2C3D4u
#define PCAP_MAGIC_NS 0xA1B23C4Du
#define PCAPNG_SHB 0x0A0D0D0Au
#define PCAPNG_IDB 0x00000001u
#define PCAPNG_PB 0x00000002u /* obsolete Packet Block (Appendix) */
#define PCAPNG_SPB 0x00000003u
#define PCAPNG_EPB 0x00000006u
#define PCAPNG_BOM 0x1A2B3C4Du
#define PCAPNG_MAX_IFACES 1024

#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10

enum format { FMT_PCAP, FMT_PCAPNG };

struct iface {
	uint32_t linktype;
	bool binary;   /* if_tsresol: 2^-exp instead of 10^-exp */
	uint8_t exp;
	int64_t offset_us; /* if_tsoffset */
};

/* One TCP segment as parsed from a packet; slices point into the block buffer. */
struct segment {
	bool v6;
	uint8_t src[16], dst[16];
	uint16_t sport, dport;
	uint32_t seq, ack;
	uint8_t flags;
	const uint8_t *payload;
	size_t len;
};

struct stream_key {
	uint8_t client[16], server[16];
	uint16_t cport, sport;
	uint8_t v6;
	uint8_t pad[3];
};

struct ooo_seg {
	uint32_t seq;
	uint32_t len;
	bool fin;
	uint8_t *data;
};

/* One direction of a stream: `next` is the sequence number of the next byte to deliver. */
struct half {
	bool init;
	bool fin_done;
	uint32_t next;
	struct ooo_seg *segs; /* sorted by distance from next */
	size_t n, cap;
	size_t bytes;
};

/* A stream stays in the table after it closed (so late packets of it are recognised and dropped) until it has
 * been closed for the idle time or the closed ones exceed max_streams; an open stream that carried nothing for
 * the idle time, or the least recently active one when a new stream would exceed max_streams, is closed
 * (TAP_CAPTURE_END_IDLE, _LIMIT) and dropped at once, so a later packet of it starts a mid-stream stream. */
struct stream {
	struct stream_key key;
	uint64_t id;
	void *user;
	bool closed;
	bool fin_seen;
	enum tap_dir first_fin; /* the direction of the first FIN, once fin_seen */
	struct half h[TAP_DIR_COUNT];
	int64_t last_ts; /* capture time of its last packet, or of its close once closed */
	struct stream *hnext;  /* hash chain */
	struct stream_link {
		struct stream *prev, *next;
	} by_start, by_age; /* open streams in creation order; open streams by last packet, or closed ones by close */
};

/* A list of streams through one of their links (the link's offset in struct stream), oldest first. */
struct stream_list {
	struct stream *head, *tail;
	size_t n;
	size_t link;
};

struct tap_capture {
	char *name;
	FILE *f;
	bool stream; /* a pipe or device: unbuffered, idle callback before a read that may wait */
	uint8_t back[4]; /* bytes read to tell the format, read again first (a pipe cannot seek back) */
	size_t back_len, back_off;
	const uint8_t *mem;
	size_t mem_len;
	uint64_t off; /* file offset of the next unread byte */
	enum format fmt;
	bool swap;
	bool ran;
	/* pcap */
	uint32_t linktype;
	bool nsec;
	/* pcapng section */
	struct iface *ifs;
	size_t n_ifs, cap_ifs;
	uint8_t *blk;
	size_t blk_cap;
	int64_t last_ts;
	/* reassembly */
	uint16_t port;
	const struct tap_capture_cb *cb;
	struct stream **tab;
	size_t tab_size, n_streams;
	struct stream_list open;       /* by_start */
	struct stream_list live, dead; /* by_age: open streams by activity; closed ones kept for their late packets */
	int64_t idle_us;
	size_t max_streams;
	struct tap_capture_stats st;
};

static int fail(char *err, size_t cap, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t cap, int rc, const char *fmt, ...)
{
	if (err && cap) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, cap, fmt, ap);
		va_end(ap);
	}
	return rc;
}

static size_t src_read(struct tap_capture *c, void *buf, size_t n)
{
	size_t got = 0;
	if (c->back_off < c->back_len && n > 0) {
		got = c->back_len - c->back_off < n ? c->back_len - c->back_off : n;
		memcpy(buf, c->back + c->back_off, got);
		c->back_off += got;
		c->off += got;
		if (got == n)
			return got;
		return got + src_read(c, (uint8_t *)buf + got, n - got);
	}
	if (c->f) {
		got = fread(buf, 1, n, c->f);
	} else {
		size_t left = c->mem_len - (size_t)c->off;
		got = n < left ? n : left;
		if (got) /* buf may be NULL for an empty block body */
			memcpy(buf, c->mem + c->off, got);
	}
	c->off += got;
	return got;
}

/* Before the next record of a pipe: when no byte is waiting, the caller hears so before the read blocks. */
static void idle_hint(struct tap_capture *c)
{
	if (!c->stream || !c->cb || !c->cb->idle)
		return;
	struct pollfd p = {.fd = fileno(c->f), .events = POLLIN};
	if (poll(&p, 1, 0) == 0)
		c->cb->idle(c->cb->ctx);
}

static uint32_t rd32(const struct tap_capture *c, const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return c->swap ? __builtin_bswap32(v) : v;
}

static uint16_t rd16(const struct tap_capture *c, const uint8_t *p)
{
	uint16_t v;
	memcpy(&v, p, 2);
	return c->swap ? __builtin_bswap16(v) : v;
}

static bool blk_reserve(struct tap_capture *c, size_t n)
{
	if (n <= c->blk_cap)
		return true;
	size_t cap = c->blk_cap ? c->blk_cap : 65536;
	while (cap < n)
		cap *= 2;
	uint8_t *p = realloc(c->blk, cap);
	if (!p)
		return false;
	c->blk = p;
	c->blk_cap = cap;
	return true;
}

/* ---- TCP reassembly ---- */

static size_t key_hash(const struct stream_key *k, size_t size)
{
	uint64_t h = 1469598103934665603ull;
	const uint8_t *p = (const uint8_t *)k;
	for (size_t i = 0; i < sizeof *k; i++)
		h = (h ^ p[i]) * 1099511628211ull;
	return (size_t)(h ^ (h >> 29)) & (size - 1);
}

static struct stream *stream_find(struct tap_capture *c, const struct stream_key *k)
{
	if (!c->tab)
		return NULL;
	for (struct stream *s = c->tab[key_hash(k, c->tab_size)]; s; s = s->hnext)
		if (memcmp(&s->key, k, sizeof *k) == 0)
			return s;
	return NULL;
}

static bool tab_grow(struct tap_capture *c)
{
	size_t size = c->tab_size ? c->tab_size * 2 : 256;
	struct stream **tab = calloc(size, sizeof *tab);
	if (!tab)
		return false;
	for (size_t i = 0; i < c->tab_size; i++) {
		struct stream *s = c->tab[i];
		while (s) {
			struct stream *next = s->hnext;
			size_t h = key_hash(&s->key, size);
			s->hnext = tab[h];
			tab[h] = s;
			s = next;
		}
	}
	free(c->tab);
	c->tab = tab;
	c->tab_size = size;
	return true;
}

static struct stream_link *link_of(const struct stream_list *l, struct stream *s)
{
	return (struct stream_link *)((char *)s + l->link);
}

static void list_unlink(struct stream_list *l, struct stream *s)
{
	struct stream_link *k = link_of(l, s);
	if (k->prev)
		link_of(l, k->prev)->next = k->next;
	else
		l->head = k->next;
	if (k->next)
		link_of(l, k->next)->prev = k->prev;
	else
		l->tail = k->prev;
	*k = (struct stream_link){NULL, NULL};
	l->n--;
}

static void list_append(struct stream_list *l, struct stream *s)
{
	struct stream_link *k = link_of(l, s);
	*k = (struct stream_link){l->tail, NULL};
	if (l->tail)
		link_of(l, l->tail)->next = s;
	else
		l->head = s;
	l->tail = s;
	l->n++;
}

static void half_clear(struct half *h)
{
	for (size_t i = 0; i < h->n; i++)
		free(h->segs[i].data);
	free(h->segs);
	memset(h, 0, sizeof *h);
}

static void addr_text(char out[64], bool v6, const uint8_t *addr, uint16_t port)
{
	char ip[INET6_ADDRSTRLEN];
	if (!inet_ntop(v6 ? AF_INET6 : AF_INET, addr, ip, sizeof ip))
		strcpy(ip, "?");
	snprintf(out, 64, v6 ? "[%s]:%u" : "%s:%u", ip, port);
}

static enum tap_capture_end fin_end(const struct stream *s)
{
	return s->first_fin == TAP_C2S ? TAP_CAPTURE_END_CLIENT_FIN : TAP_CAPTURE_END_SERVER_FIN;
}

static void flush_holes(struct tap_capture *c, struct stream *s, int64_t ts);

static void stream_close(struct tap_capture *c, struct stream *s, enum tap_capture_end how, int64_t ts)
{
	if (s->closed)
		return;
	s->closed = true;
	s->last_ts = ts;
	list_unlink(&c->live, s);
	list_append(&c->dead, s);
	if (c->cb->close)
		c->cb->close(c->cb->ctx, s->user, how, ts);
	s->user = NULL;
	half_clear(&s->h[TAP_S2C]);
	half_clear(&s->h[TAP_C2S]);
	list_unlink(&c->open, s);
}

/* Takes a closed stream out of the table and frees it. */
static void stream_free(struct tap_capture *c, struct stream *s)
{
	struct stream **pp = &c->tab[key_hash(&s->key, c->tab_size)];
	while (*pp != s)
		pp = &(*pp)->hnext;
	*pp = s->hnext;
	list_unlink(&c->dead, s);
	c->n_streams--;
	free(s);
}

/* Closes and frees streams idle for idle_us at capture time ts, and closed ones kept as long. */
static void expire(struct tap_capture *c, int64_t ts)
{
	struct stream *s;
	while ((s = c->live.head) && ts - s->last_ts >= c->idle_us) {
		c->st.idle_closed++;
		flush_holes(c, s, ts);
		stream_close(c, s, TAP_CAPTURE_END_IDLE, ts);
		stream_free(c, s);
	}
	while ((s = c->dead.head) && ts - s->last_ts >= c->idle_us)
		stream_free(c, s);
}

/* Room for one more stream under max_streams: the oldest closed one is forgotten, else the least recently active
 * open one is closed. */
static void make_room(struct tap_capture *c, int64_t ts)
{
	while (c->dead.n > 0 && c->dead.n + c->live.n >= c->max_streams)
		stream_free(c, c->dead.head);
	while (c->live.n > 0 && c->live.n >= c->max_streams) {
		struct stream *s = c->live.head;
		c->st.evicted++;
		flush_holes(c, s, ts);
		stream_close(c, s, TAP_CAPTURE_END_LIMIT, ts);
		stream_free(c, s);
	}
}

/* A new stream in place of a closed one with the same key, or a fresh one. */
static struct stream *stream_open(struct tap_capture *c, struct stream *old, const struct stream_key *k, bool midstream,
				  int64_t ts)
{
	struct stream *s = old;
	if (!s) {
		make_room(c, ts);
		if (c->n_streams >= c->tab_size && !tab_grow(c))
			return NULL;
		s = calloc(1, sizeof *s);
		if (!s)
			return NULL;
		s->key = *k;
		size_t h = key_hash(k, c->tab_size);
		s->hnext = c->tab[h];
		c->tab[h] = s;
		c->n_streams++;
	} else {
		list_unlink(&c->dead, s);
		struct stream *hnext = s->hnext;
		memset(s, 0, sizeof *s);
		s->key = *k;
		s->hnext = hnext;
	}
	s->last_ts = ts;
	list_append(&c->live, s);
	list_append(&c->open, s);
	s->id = ++c->st.streams;
	if (c->cb->open) {
		char client[64], server[64];
		addr_text(client, k->v6, k->client, k->cport);
		addr_text(server, k->v6, k->server, k->sport);
		s->user = c->cb->open(c->cb->ctx, s->id, client, server, midstream, ts);
	}
	return s;
}

static void emit(struct tap_capture *c, struct stream *s, enum tap_dir dir, const uint8_t *data, size_t len,
		 int64_t ts)
{
	struct half *h = &s->h[dir];
	h->next += (uint32_t)len;
	c->st.bytes += len;
	if (len && c->cb->data)
		c->cb->data(c->cb->ctx, s->user, dir, data, len, ts);
}

static void reach_fin(struct stream *s, enum tap_dir dir)
{
	struct half *h = &s->h[dir];
	h->fin_done = true;
	h->next++;
	if (!s->fin_seen) {
		s->fin_seen = true;
		s->first_fin = dir;
	}
}

/* Delivers [seq, seq+len) (+FIN) if it starts at or before `next`; returns false when it lies ahead. */
static bool deliver_inorder(struct tap_capture *c, struct stream *s, enum tap_dir dir, uint32_t seq, const uint8_t *data,
			    size_t len, bool fin, int64_t ts)
{
	struct half *h = &s->h[dir];
	int32_t rel = (int32_t)(seq - h->next);
	if (rel > 0)
		return false;
	size_t old = (size_t)(-(int64_t)rel);
	if (old >= len + (fin ? 1 : 0)) {
		if (len || fin)
			c->st.retransmitted++;
		return true;
	}
	if (old > 0) {
		c->st.retransmitted++;
		if (old <= len) {
			data += old;
			len -= old;
		}
	}
	emit(c, s, dir, data, len, ts);
	if (fin && !h->fin_done)
		reach_fin(s, dir);
	return true;
}

static void drain(struct tap_capture *c, struct stream *s, enum tap_dir dir, int64_t ts)
{
	struct half *h = &s->h[dir];
	while (h->n > 0 && !h->fin_done && !s->closed) {
		struct ooo_seg g = h->segs[0];
		if ((int32_t)(g.seq - h->next) > 0)
			break;
		memmove(h->segs, h->segs + 1, (h->n - 1) * sizeof *h->segs);
		h->n--;
		h->bytes -= g.len;
		deliver_inorder(c, s, dir, g.seq, g.data, g.len, g.fin, ts);
		free(g.data);
	}
}

/* Gives up on the hole before the first buffered segment. */
static void skip_hole(struct tap_capture *c, struct stream *s, enum tap_dir dir, int64_t ts)
{
	struct half *h = &s->h[dir];
	uint32_t missing = h->segs[0].seq - h->next;
	c->st.gaps++;
	h->next = h->segs[0].seq;
	if (c->cb->gap)
		c->cb->gap(c->cb->ctx, s->user, dir, missing, ts);
	drain(c, s, dir, ts);
}

/* The stream ends with segments still buffered behind holes: the holes are given up on (gap callbacks) and what
 * follows them delivered, so the data and a FIN behind a lost segment are not lost with it. */
static void flush_holes(struct tap_capture *c, struct stream *s, int64_t ts)
{
	for (int d = 0; d < TAP_DIR_COUNT; d++) {
		struct half *h = &s->h[d];
		while (h->n > 0 && !h->fin_done && !s->closed)
			skip_hole(c, s, (enum tap_dir)d, ts);
	}
}

/* The peer acknowledged bytes of `dir` up to `ack`: a hole below that was delivered on the wire and lost only by
 * the capture, so it will never be retransmitted; it is given up on at once instead of when the buffer fills. */
static void skip_acked(struct tap_capture *c, struct stream *s, enum tap_dir dir, uint32_t ack, int64_t ts)
{
	struct half *h = &s->h[dir];
	while (h->init && h->n > 0 && !h->fin_done && !s->closed && (int32_t)(ack - h->next) > 0)
		skip_hole(c, s, dir, ts);
}

static int buffer_ahead(struct tap_capture *c, struct stream *s, enum tap_dir dir, uint32_t seq, const uint8_t *data,
			size_t len, bool fin, int64_t ts)
{
	struct half *h = &s->h[dir];
	while (h->n > 0 && (h->n >= TAP_CAPTURE_MAX_OOO_SEGS || h->bytes + len > TAP_CAPTURE_MAX_OOO_BYTES)) {
		skip_hole(c, s, dir, ts);
		if (h->fin_done)
			return TAP_OK;
		if (deliver_inorder(c, s, dir, seq, data, len, fin, ts)) {
			drain(c, s, dir, ts);
			return TAP_OK;
		}
	}
	if (len > TAP_CAPTURE_MAX_OOO_BYTES) { /* cannot be buffered at all: jump to it */
		c->st.gaps++;
		uint32_t missing = seq - h->next;
		h->next = seq;
		if (c->cb->gap)
			c->cb->gap(c->cb->ctx, s->user, dir, missing, ts);
		deliver_inorder(c, s, dir, seq, data, len, fin, ts);
		return TAP_OK;
	}
	if (h->n == h->cap) {
		size_t cap = h->cap ? h->cap * 2 : 8;
		struct ooo_seg *p = realloc(h->segs, cap * sizeof *p);
		if (!p)
			return TAP_E_NOMEM;
		h->segs = p;
		h->cap = cap;
	}
	struct ooo_seg g = {seq, (uint32_t)len, fin, NULL};
	if (len) {
		g.data = malloc(len);
		if (!g.data)
			return TAP_E_NOMEM;
		memcpy(g.data, data, len);
	}
	uint32_t rel = seq - h->next;
	size_t i = h->n;
	while (i > 0 && h->segs[i - 1].seq - h->next > rel)
		i--;
	memmove(h->segs + i + 1, h->segs + i, (h->n - i) * sizeof *h->segs);
	h->segs[i] = g;
	h->n++;
	h->bytes += len;
	c->st.out_of_order++;
	return TAP_OK;
}

static int on_segment(struct tap_capture *c, const struct segment *g, int64_t ts)
{
	struct stream_key k;
	memset(&k, 0, sizeof k);
	k.v6 = g->v6;
	size_t alen = g->v6 ? 16 : 4;
	bool to_server = g->dport == c->port, from_server = g->sport == c->port;
	if (!to_server && !from_server)
		return TAP_OK;
	c->st.tcp_packets++;
	bool syn_only = (g->flags & (TCP_SYN | TCP_ACK)) == TCP_SYN;
	enum tap_dir dir;
	struct stream *s = NULL;
	/* c2s orientation: sender is the client. */
	struct stream_key kc = k, ks = k;
	memcpy(kc.client, g->src, alen);
	memcpy(kc.server, g->dst, alen);
	kc.cport = g->sport;
	kc.sport = g->dport;
	memcpy(ks.client, g->dst, alen);
	memcpy(ks.server, g->src, alen);
	ks.cport = g->dport;
	ks.sport = g->sport;
	if (to_server && from_server) {
		if ((s = stream_find(c, &kc)) != NULL)
			dir = TAP_C2S;
		else if ((s = stream_find(c, &ks)) != NULL)
			dir = TAP_S2C;
		else
			dir = TAP_C2S;
	} else {
		dir = to_server ? TAP_C2S : TAP_S2C;
		s = stream_find(c, dir == TAP_C2S ? &kc : &ks);
	}
	const struct stream_key *key = dir == TAP_C2S ? &kc : &ks;

	if (!s || s->closed) {
		bool handshake = (g->flags & TCP_SYN) != 0;
		if (syn_only && dir == TAP_S2C && !(to_server && from_server))
			return TAP_OK; /* a SYN from the broker port: not a connection to the broker */
		if (!handshake && (g->len == 0 || (g->flags & TCP_RST)))
			return TAP_OK; /* teardown or keepalive of a stream we never saw: nothing to deliver */
		if (s && !handshake)
			return TAP_OK; /* late packets of a closed stream */
		s = stream_open(c, s, key, !handshake, ts);
		if (!s)
			return TAP_E_NOMEM;
	} else {
		s->last_ts = ts;
		list_unlink(&c->live, s);
		list_append(&c->live, s);
	}
	struct half *h = &s->h[dir];
	uint32_t seq = g->seq;
	if (g->flags & TCP_SYN) {
		if (!h->init) {
			h->init = true;
			h->next = seq + 1;
		}
		seq++;
		struct half *back = &s->h[tap_dir_reverse(dir)];
		if ((g->flags & TCP_ACK) && !back->init) {
			back->init = true;
			back->next = g->ack;
		}
	}
	if (!h->init) {
		h->init = true;
		h->next = seq;
	}
	if ((g->flags & TCP_ACK) && !(g->flags & TCP_SYN))
		skip_acked(c, s, tap_dir_reverse(dir), g->ack, ts);
	if (s->closed)
		return TAP_OK;
	if (g->flags & TCP_RST) {
		drain(c, s, dir, ts);
		flush_holes(c, s, ts);
		enum tap_capture_end how = dir == TAP_C2S ? TAP_CAPTURE_END_CLIENT_RST : TAP_CAPTURE_END_SERVER_RST;
		if (s->fin_seen) /* a reset answering a FIN: the FIN ended the connection */
			how = fin_end(s);
		stream_close(c, s, how, ts);
		return TAP_OK;
	}
	bool fin = (g->flags & TCP_FIN) != 0;
	if (h->fin_done || (g->len == 0 && !fin))
		return TAP_OK;
	if (deliver_inorder(c, s, dir, seq, g->payload, g->len, fin, ts)) {
		drain(c, s, dir, ts);
	} else {
		int rc = buffer_ahead(c, s, dir, seq, g->payload, g->len, fin, ts);
		if (rc < 0)
			return rc;
	}
	if (s->h[TAP_S2C].fin_done && s->h[TAP_C2S].fin_done)
		stream_close(c, s, fin_end(s), ts);
	return TAP_OK;
}

/* ---- packet parsing ---- */

static bool parse_tcp(struct segment *g, const uint8_t *p, size_t len)
{
	if (len < 20)
		return false;
	size_t doff = (size_t)(p[12] >> 4) * 4;
	if (doff < 20 || doff > len)
		return false;
	g->sport = tap_be16(p);
	g->dport = tap_be16(p + 2);
	g->seq = tap_be32(p + 4);
	g->ack = tap_be32(p + 8);
	g->flags = p[13];
	g->payload = p + doff;
	g->len = len - doff;
	return true;
}

/* RFC 791 §3.1; fragments are not reassembled. */
static bool parse_ipv4(struct segment *g, const uint8_t *p, size_t len)
{
	if (len < 20 || (p[0] >> 4) != 4)
		return false;
	size_t ihl = (size_t)(p[0] & 0x0F) * 4;
	size_t total = tap_be16(p + 2);
	if (ihl < 20 || total < ihl || total > len)
		return false;
	if ((tap_be16(p + 6) & 0x3FFF) != 0 || p[9] != 6)
		return false;
	g->v6 = false;
	memcpy(g->src, p + 12, 4);
	memcpy(g->dst, p + 16, 4);
	return parse_tcp(g, p + ihl, total - ihl);
}

/* RFC 8200 §4: hop-by-hop, routing, destination options and AH are skipped; fragments are not handled. */
static bool parse_ipv6(struct segment *g, const uint8_t *p, size_t len)
{
	if (len < 40 || (p[0] >> 4) != 6)
		return false;
	size_t plen = tap_be16(p + 4);
	if (plen == 0 || 40 + plen > len)
		return false;
	uint8_t nh = p[6];
	size_t off = 40, end = 40 + plen;
	for (int i = 0; i < 16 && nh != 6; i++) {
		if (off + 8 > end)
			return false;
		size_t hl;
		if (nh == 0 || nh == 43 || nh == 60)
			hl = ((size_t)p[off + 1] + 1) * 8;
		else if (nh == 51)
			hl = ((size_t)p[off + 1] + 2) * 4;
		else
			return false;
		nh = p[off];
		off += hl;
	}
	if (nh != 6 || off > end)
		return false;
	g->v6 = true;
	memcpy(g->src, p + 8, 16);
	memcpy(g->dst, p + 24, 16);
	return parse_tcp(g, p + off, end - off);
}

static bool parse_ip(struct segment *g, const uint8_t *p, size_t len)
{
	if (len < 1)
		return false;
	if ((p[0] >> 4) == 4)
		return parse_ipv4(g, p, len);
	if ((p[0] >> 4) == 6)
		return parse_ipv6(g, p, len);
	return false;
}

static bool parse_ethertype(struct segment *g, uint16_t type, const uint8_t *p, size_t len)
{
	if (type == 0x0800)
		return parse_ipv4(g, p, len);
	if (type == 0x86DD)
		return parse_ipv6(g, p, len);
	return false;
}

static bool parse_link(struct segment *g, uint32_t linktype, const uint8_t *p, size_t len)
{
	switch (linktype) {
	case TAP_CAPTURE_LINK_ETHERNET: {
		if (len < 14)
			return false;
		size_t off = 12;
		uint16_t type = tap_be16(p + off);
		while (type == 0x8100 || type == 0x88A8 || type == 0x9100) { /* 802.1Q / 802.1ad tags */
			off += 4;
			if (off + 2 > len)
				return false;
			type = tap_be16(p + off);
		}
		return parse_ethertype(g, type, p + off + 2, len - off - 2);
	}
	case TAP_CAPTURE_LINK_RAW:
	case TAP_CAPTURE_LINK_IPV4:
	case TAP_CAPTURE_LINK_IPV6:
		return parse_ip(g, p, len);
	case TAP_CAPTURE_LINK_NULL:
	case TAP_CAPTURE_LINK_LOOP: /* 4-byte address family, in either byte order: the IP version tells */
		return len >= 4 && parse_ip(g, p + 4, len - 4);
	case TAP_CAPTURE_LINK_LINUX_SLL:
		return len >= 16 && parse_ethertype(g, tap_be16(p + 14), p + 16, len - 16);
	case TAP_CAPTURE_LINK_LINUX_SLL2:
		return len >= 20 && parse_ethertype(g, tap_be16(p), p + 20, len - 20);
	default:
		return false;
	}
}

static int on_packet(struct tap_capture *c, uint32_t linktype, int64_t ts, const uint8_t *p, size_t caplen)
{
	c->st.packets++;
	c->last_ts = ts;
	if (c->cb->packet)
		c->cb->packet(c->cb->ctx, ts);
	expire(c, ts);
	struct segment g;
	if (!parse_link(&g, linktype, p, caplen)) {
		c->st.skipped++;
		return TAP_OK;
	}
	return on_segment(c, &g, ts);
}

/* ---- classic pcap ---- */

static int pcap_run(struct tap_capture *c, char *err, size_t cap)
{
	uint8_t rh[16];
	for (;;) {
		idle_hint(c);
		uint64_t at = c->off;
		size_t n = src_read(c, rh, sizeof rh);
		if (n == 0)
			return TAP_OK;
		if (n < sizeof rh)
			return fail(err, cap, TAP_E_BAD_CAPTURE, "%s: truncated record header at offset %" PRIu64,
				    c->name, at);
		uint32_t incl = rd32(c, rh + 8);
		if (incl > TAP_CAPTURE_MAX_BLOCK)
			return fail(err, cap, TAP_E_BAD_CAPTURE,
				    "%s: corrupt record length %" PRIu32 " at offset %" PRIu64, c->name, incl, at);
		if (!blk_reserve(c, incl))
			return fail(err, cap, TAP_E_NOMEM, "%s: out of memory", c->name);
		if (src_read(c, c->blk, incl) < incl)
			return fail(err, cap, TAP_E_BAD_CAPTURE, "%s: truncated record at offset %" PRIu64, c->name, at);
		uint32_t frac = rd32(c, rh + 4);
		int64_t ts = (int64_t)rd32(c, rh) * 1000000 + (int64_t)(c->nsec ? frac / 1000 : frac);
		c->st.file_bytes = c->off;
		int rc = on_packet(c, c->linktype, ts, c->blk, incl);
		if (rc < 0)
			return fail(err, cap, rc, "%s: %s at offset %" PRIu64, c->name, tap_strerror(rc), at);
	}
}

/* ---- pcapng ---- */

static int64_t iface_ts(const struct iface *f, uint64_t units)
{
	int64_t us;
	if (f->binary) {
		us = (int64_t)(((unsigned __int128)units * 1000000u) >> (f->exp < 127 ? f->exp : 127));
	} else if (f->exp == 6) {
		us = (int64_t)units;
	} else if (f->exp < 6) {
		uint64_t m = 1;
		for (int i = f->exp; i < 6; i++)
			m *= 10;
		us = (int64_t)(units * m);
	} else {
		uint64_t d = 1;
		for (int i = 6; i < f->exp && i < 25; i++)
			d = d > UINT64_MAX / 10 ? UINT64_MAX : d * 10;
		us = (int64_t)(units / d);
	}
	int64_t ts;
	if (__builtin_add_overflow(us, f->offset_us, &ts)) /* a nonsense if_tsoffset: keep the raw time */
		ts = us;
	return ts;
}

/* §4.2: if_tsresol (9) and if_tsoffset (14). */
static int idb(struct tap_capture *c, const uint8_t *b, size_t len)
{
	if (len < 8)
		return TAP_E_BAD_CAPTURE;
	if (c->n_ifs >= PCAPNG_MAX_IFACES)
		return TAP_E_BAD_CAPTURE;
	if (c->n_ifs == c->cap_ifs) {
		size_t cap = c->cap_ifs ? c->cap_ifs * 2 : 4;
		struct iface *p = realloc(c->ifs, cap * sizeof *p);
		if (!p)
			return TAP_E_NOMEM;
		c->ifs = p;
		c->cap_ifs = cap;
	}
	struct iface f = {.linktype = rd16(c, b), .exp = 6};
	size_t off = 8;
	while (off + 4 <= len) {
		uint16_t code = rd16(c, b + off), olen = rd16(c, b + off + 2);
		if (code == 0 || off + 4 + olen > len)
			break;
		const uint8_t *v = b + off + 4;
		if (code == 9 && olen >= 1) {
			f.binary = (v[0] & 0x80) != 0;
			f.exp = v[0] & 0x7F;
		} else if (code == 14 && olen >= 8) {
			uint64_t o;
			memcpy(&o, v, 8);
			if (c->swap)
				o = __builtin_bswap64(o);
			/* seconds; an offset past year 292,277 cannot be a real one */
			f.offset_us = o <= (uint64_t)(INT64_MAX / 1000000) ? (int64_t)o * 1000000 : 0;
		}
		off += 4 + (((size_t)olen + 3) & ~(size_t)3);
	}
	c->ifs[c->n_ifs++] = f;
	return TAP_OK;
}

/* Reads one block into c->blk: the body starts there, *blen long (without the length fields). 0 at a clean end of file,
 * 1 when a block was read. */
static int block_read(struct tap_capture *c, uint32_t *type, size_t *blen, uint64_t *at, char *err, size_t cap)
{
	uint8_t h[12];
	idle_hint(c);
	*at = c->off;
	size_t n = src_read(c, h, 8);
	if (n == 0)
		return 0;
	if (n < 8)
		return fail(err, cap, TAP_E_BAD_CAPTURE, "%s: truncated block header at offset %" PRIu64, c->name, *at);
	uint32_t t;
	memcpy(&t, h, 4);
	if (t == PCAPNG_SHB) { /* §4.1: the byte-order magic decides how to read the rest of the section */
		if (src_read(c, h + 8, 4) < 4)
			return fail(err, cap, TAP_E_BAD_CAPTURE, "%s: truncated section header at offset %" PRIu64,
				    c->name, *at);
		uint32_t bom;
		memcpy(&bom, h + 8, 4);
		if (bom == PCAPNG_BOM)
			c->swap = false;
		else if (bom == __builtin_bswap32(PCAPNG_BOM))
			c->swap = true;
		else
			return fail(err, cap, TAP_E_BAD_CAPTURE, "%s: bad byte-order magic at offset %" PRIu64,
				    c->name, *at + 8);
	}
	*type = rd32(c, h);
	uint32_t total = rd32(c, h + 4);
	if (total < 12 || total % 4 || total > TAP_CAPTURE_MAX_BLOCK || (t == PCAPNG_SHB && total < 28))
		return fail(err, cap, TAP_E_BAD_CAPTURE, "%s: corrupt block length %" PRIu32 " at offset %" PRIu64,
			    c->name, total, *at);
	size_t have = t == PCAPNG_SHB ? 4 : 0;
	if (!blk_reserve(c, total))
		return fail(err, cap, TAP_E_NOMEM, "%s: out of memory", c->name);
	memcpy(c->blk, h + 8, have);
	size_t want = total - 8 - have;
	if (src_read(c, c->blk + have, want) < want)
		return fail(err, cap, TAP_E_BAD_CAPTURE, "%s: truncated block at offset %" PRIu64, c->name, *at);
	if (rd32(c, c->blk + total - 12) != total)
		return fail(err, cap, TAP_E_BAD_CAPTURE,
			    "%s: block length trailer does not match at offset %" PRIu64, c->name, *at);
	*blen = total - 12;
	return 1;
}

static int block_handle(struct tap_capture *c, uint32_t type, size_t len, uint64_t at, char *err, size_t cap)
{
	const uint8_t *b = c->blk;
	int rc = TAP_OK;
	switch (type) {
	case PCAPNG_SHB:
		if (len < 16 || rd16(c, b + 4) != 1)
			return fail(err, cap, TAP_E_BAD_CAPTURE, "%s: unsupported section header at offset %" PRIu64,
				    c->name, at);
		c->n_ifs = 0;
		return TAP_OK;
	case PCAPNG_IDB:
		rc = idb(c, b, len);
		if (rc < 0)
			return fail(err, cap, rc, "%s: bad interface description at offset %" PRIu64, c->name, at);
		return TAP_OK;
	case PCAPNG_EPB:
	case PCAPNG_PB: {
		if (len < 20)
			return fail(err, cap, TAP_E_BAD_CAPTURE, "%s: short packet block at offset %" PRIu64, c->name,
				    at);
		uint32_t ifid = type == PCAPNG_EPB ? rd32(c, b) : rd16(c, b);
		uint64_t units = (uint64_t)rd32(c, b + 4) << 32 | rd32(c, b + 8);
		uint32_t caplen = rd32(c, b + 12);
		if (caplen > len - 20)
			return fail(err, cap, TAP_E_BAD_CAPTURE,
				    "%s: packet length %" PRIu32 " exceeds its block at offset %" PRIu64, c->name,
				    caplen, at);
		if (ifid >= c->n_ifs)
			return fail(err, cap, TAP_E_BAD_CAPTURE, "%s: unknown interface %" PRIu32 " at offset %" PRIu64,
				    c->name, ifid, at);
		const struct iface *f = &c->ifs[ifid];
		rc = on_packet(c, f->linktype, iface_ts(f, units), b + 20, caplen);
		break;
	}
	case PCAPNG_SPB: { /* §4.4: no timestamp; interface 0 */
		if (len < 4 || c->n_ifs == 0)
			return fail(err, cap, TAP_E_BAD_CAPTURE, "%s: bad simple packet block at offset %" PRIu64,
				    c->name, at);
		uint32_t orig = rd32(c, b);
		size_t caplen = orig < len - 4 ? orig : len - 4;
		rc = on_packet(c, c->ifs[0].linktype, c->last_ts, b + 4, caplen);
		break;
	}
	default:
		return TAP_OK; /* name resolution, statistics, custom, decryption secrets... */
	}
	if (rc < 0)
		return fail(err, cap, rc, "%s: %s at offset %" PRIu64, c->name, tap_strerror(rc), at);
	return TAP_OK;
}

static int pcapng_run(struct tap_capture *c, char *err, size_t cap)
{
	for (;;) {
		uint32_t type;
		size_t len;
		uint64_t at;
		int rc = block_read(c, &type, &len, &at, err, cap);
		if (rc <= 0)
			return rc;
		c->st.file_bytes = c->off;
		if ((rc = block_handle(c, type, len, at, err, cap)) < 0)
			return rc;
	}
}

/* ---- open / run ---- */

static int open_common(struct tap_capture *c, char *err, size_t cap)
{
	uint8_t h[24];
	size_t n = src_read(c, h, 4);
	if (n < 4)
		return fail(err, cap, TAP_E_BAD_CAPTURE, "%s: too short for a capture file (offset %zu)", c->name, n);
	uint32_t magic;
	memcpy(&magic, h, 4);
	if (magic == PCAPNG_SHB) {
		c->fmt = FMT_PCAPNG;
		c->off = 0;
		memcpy(c->back, h, 4);
		c->back_len = 4;
		c->back_off = 0;
		uint32_t type;
		size_t len;
		uint64_t at;
		int rc = block_read(c, &type, &len, &at, err, cap);
		if (rc == 0)
			return fail(err, cap, TAP_E_BAD_CAPTURE, "%s: empty", c->name);
		if (rc < 0)
			return rc;
		return block_handle(c, type, len, at, err, cap);
	}
	c->fmt = FMT_PCAP;
	if (magic == PCAP_MAGIC_US || magic == PCAP_MAGIC_NS) {
		c->swap = false;
	} else if (magic == __builtin_bswap32(PCAP_MAGIC_US) || magic == __builtin_bswap32(PCAP_MAGIC_NS)) {
		c->swap = true;
	} else {
		return fail(err, cap, TAP_E_BAD_CAPTURE, "%s: not a pcap or pcapng file (magic %08" PRIx32 " at offset 0)",
			    c->name, magic);
	}
	c->nsec = rd32(c, h) == PCAP_MAGIC_NS;
	if (src_read(c, h + 4, 20) < 20)
		return fail(err, cap, TAP_E_BAD_CAPTURE, "%s: truncated file header at offset %" PRIu64, c->name,
			    c->off);
	c->linktype = rd32(c, h + 20) & 0x0FFFFFFF; /* upper bits: FCS length */
	return TAP_OK;
}

static int capture_new(struct tap_capture **out, const char *name)
{
	struct tap_capture *c = calloc(1, sizeof *c);
	if (!c)
		return TAP_E_NOMEM;
	c->name = strdup(name ? name : "capture");
	if (!c->name) {
		free(c);
		return TAP_E_NOMEM;
	}
	tap_capture_set_limits(c, 0, 0);
	c->open.link = offsetof(struct stream, by_start);
	c->live.link = offsetof(struct stream, by_age);
	c->dead.link = offsetof(struct stream, by_age);
	*out = c;
	return TAP_OK;
}

int tap_capture_open(struct tap_capture **out, const char *path, char *err, size_t cap)
{
	*out = NULL;
	struct tap_capture *c;
	if (capture_new(&c, path) < 0)
		return fail(err, cap, TAP_E_NOMEM, "out of memory");
	if (strcmp(path, "-") == 0) {
		int fd = dup(STDIN_FILENO);
		c->f = fd >= 0 ? fdopen(fd, "rb") : NULL;
		if (!c->f && fd >= 0)
			(void)close(fd); /* fdopen failed: the descriptor is ours to close */
	} else {
		c->f = fopen(path, "rb");
	}
	if (!c->f) {
		int rc = fail(err, cap, TAP_E_IO, "%s: %s", path, strerror(errno));
		tap_capture_free(c);
		return rc;
	}
	struct stat st;
	c->stream = fstat(fileno(c->f), &st) == 0 && !S_ISREG(st.st_mode);
	if (c->stream) /* stdio would wait to fill its buffer before handing over a packet */
		setvbuf(c->f, NULL, _IONBF, 0);
	else
		setvbuf(c->f, NULL, _IOFBF, 1 << 20);
	int rc = open_common(c, err, cap);
	if (rc < 0) {
		tap_capture_free(c);
		return rc;
	}
	*out = c;
	return TAP_OK;
}

int tap_capture_open_mem(struct tap_capture **out, const void *data, size_t len, const char *name, char *err,
			 size_t cap)
{
	*out = NULL;
	struct tap_capture *c;
	if (capture_new(&c, name) < 0)
		return fail(err, cap, TAP_E_NOMEM, "out of memory");
	c->mem = data;
	c->mem_len = len;
	int rc = open_common(c, err, cap);
	if (rc < 0) {
		tap_capture_free(c);
		return rc;
	}
	*out = c;
	return TAP_OK;
}

void tap_capture_free(struct tap_capture *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->tab_size; i++) {
		struct stream *s = c->tab[i];
		while (s) {
			struct stream *next = s->hnext;
			half_clear(&s->h[TAP_S2C]);
			half_clear(&s->h[TAP_C2S]);
			free(s);
			s = next;
		}
	}
	free(c->tab);
	if (c->f)
		fclose(c->f);
	free(c->ifs);
	free(c->blk);
	free(c->name);
	free(c);
}

int tap_capture_run(struct tap_capture *c, uint16_t port, const struct tap_capture_cb *cb, char *err, size_t cap)
{
	static const struct tap_capture_cb none;
	if (c->ran)
		return fail(err, cap, TAP_E_USAGE, "%s: capture already read", c->name);
	c->ran = true;
	c->port = port;
	c->cb = cb ? cb : &none;
	int rc = c->fmt == FMT_PCAP ? pcap_run(c, err, cap) : pcapng_run(c, err, cap);
	if (rc == TAP_OK && c->f && ferror(c->f))
		rc = fail(err, cap, TAP_E_IO, "%s: read error at offset %" PRIu64, c->name, c->off);
	tap_capture_end_all(c);
	return rc;
}

int tap_capture_new_push(struct tap_capture **out, uint16_t port, const struct tap_capture_cb *cb)
{
	static const struct tap_capture_cb none;
	*out = NULL;
	struct tap_capture *c;
	int rc = capture_new(&c, "live");
	if (rc < 0)
		return rc;
	c->ran = true;
	c->port = port;
	c->cb = cb ? cb : &none;
	*out = c;
	return TAP_OK;
}

int tap_capture_push(struct tap_capture *c, uint32_t linktype, int64_t ts_us, const uint8_t *packet, size_t caplen)
{
	c->st.file_bytes += caplen;
	return on_packet(c, linktype, ts_us, packet, caplen);
}

void tap_capture_end_all(struct tap_capture *c)
{
	while (c->open.head) {
		struct stream *s = c->open.head;
		flush_holes(c, s, c->last_ts);
		enum tap_capture_end how = s->fin_seen ? fin_end(s) : TAP_CAPTURE_END_CAPTURE;
		stream_close(c, s, how, c->last_ts);
	}
}

void tap_capture_set_limits(struct tap_capture *c, int64_t idle_us, size_t max_streams)
{
	c->idle_us = idle_us > 0 ? idle_us : TAP_CAPTURE_IDLE_US_DEFAULT;
	c->max_streams = max_streams > 0 ? max_streams : TAP_CAPTURE_MAX_STREAMS_DEFAULT;
}

void tap_capture_get_stats(const struct tap_capture *c, struct tap_capture_stats *s)
{
	*s = c->st;
}
