/* Capture reader: classic pcap (https://www.tcpdump.org/manpages/pcap-savefile.5.html) and pcapng
 * (draft-ietf-opsawg-pcapng §4), link layers per https://www.tcpdump.org/linktypes.html, IPv4 (RFC 791), IPv6
 * (RFC 8200 §4 extension headers) and the TCP header; the segments go to the reassembler (reasm.h). */
#include "amqptap/capture.h"

#include "amqptap/status.h"
#include "rd.h"
#include "reasm.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCAP_MAGIC_US 0xA1B2C3D4u
#define PCAP_MAGIC_NS 0xA1B23C4Du
#define PCAPNG_SHB 0x0A0D0D0Au
#define PCAPNG_IDB 0x00000001u
#define PCAPNG_PB 0x00000002u /* obsolete Packet Block (Appendix) */
#define PCAPNG_SPB 0x00000003u
#define PCAPNG_EPB 0x00000006u
#define PCAPNG_BOM 0x1A2B3C4Du
#define PCAPNG_MAX_IFACES 1024

enum format { FMT_PCAP, FMT_PCAPNG };

struct iface {
	uint32_t linktype;
	bool binary;   /* if_tsresol: 2^-exp instead of 10^-exp */
	uint8_t exp;
	int64_t offset_us; /* if_tsoffset */
};

struct tap_capture {
	char *name;
	const struct tap_capture_src_ops *ops; /* NULL: the bytes are mem's */
	void *src;
	struct tap_capture_waiter waiter; /* what the source asks while it waits */
	uint8_t back[4]; /* bytes read to tell the format, read again first (a pipe cannot seek back) */
	size_t back_len, back_off;
	const uint8_t *mem;
	size_t mem_len;
	uint64_t off; /* file offset of the next unread byte */
	enum format fmt;
	bool swap;
	bool ran;
	bool stopped_early; /* a stop came before the header was read: a capture without packets */
	bool (*open_stop)(void *ctx); /* the stop asked while opening, before cb (tap_capture_open_src) */
	void *open_ctx;
	/* pcap */
	uint32_t linktype;
	bool nsec;
	/* pcapng section */
	struct iface *ifs;
	size_t n_ifs, cap_ifs;
	uint8_t *blk;
	size_t blk_cap;
	int64_t last_ts;
	const struct tap_capture_cb *cb;
	struct tap_reasm reasm;
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

static bool stopping(const struct tap_capture *c)
{
	if (c->cb)
		return c->cb->stop && c->cb->stop(c->cb->ctx);
	return c->open_stop && c->open_stop(c->open_ctx);
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
	if (c->ops) {
		got = c->ops->read(c->src, buf, n, &c->waiter);
	} else {
		size_t left = c->mem_len - (size_t)c->off;
		got = n < left ? n : left;
		if (got) /* buf may be NULL for an empty block body */
			memcpy(buf, c->mem + c->off, got);
	}
	c->off += got;
	return got;
}

static bool waiter_stop(void *ctx)
{
	return stopping(ctx);
}

static void waiter_idle(void *ctx)
{
	const struct tap_capture *c = ctx;
	c->cb->idle(c->cb->ctx);
}

/* Before the next record of a source that may wait (a pipe): the caller hears so while no byte is waiting (it
 * writes what it batched; a live capture's clock goes on), until one is or it says to stop. */
static void idle_hint(struct tap_capture *c)
{
	if (c->ops && c->ops->wait && c->waiter.idle)
		c->ops->wait(c->src, &c->waiter);
}

static enum tap_capture_src_state src_state(const struct tap_capture *c)
{
	return c->ops ? c->ops->state(c->src) : TAP_CAPTURE_SRC_OK;
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

/* ---- packet parsing ---- */

/* len: the TCP bytes captured; lost: those after them that the snap length cut off (the segment's payload on the
 * wire is len - header + lost). A header that is not whole tells nothing: the packet is skipped and its payload
 * becomes a gap when later packets show it missing. */
static bool parse_tcp(struct tap_segment *g, const uint8_t *p, size_t len, size_t lost)
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
	g->lost = lost;
	return true;
}

/* The IP datagram claims `total` bytes and `len` were captured, of which the snap length cut `cut` off its end:
 * the bytes the datagram lost, or SIZE_MAX when its length is not believable (longer than both). */
static size_t ip_lost(size_t total, size_t len, size_t cut)
{
	if (total <= len)
		return 0;
	return total - len <= cut ? total - len : SIZE_MAX;
}

/* RFC 791 §3.1; fragments are not reassembled (counted). A total length of 0 is a segment the sender's NIC was
 * to cut (TSO, as captured on the sender): its length is what was captured plus what the snap length cut, as
 * tshark reads it. cut: the bytes of the packet the snap length left out (0 when it was captured whole). */
static bool parse_ipv4(struct tap_segment *g, struct tap_capture_stats *st, const uint8_t *p, size_t len,
		       size_t cut)
{
	if (len < 20 || (p[0] >> 4) != 4)
		return false;
	size_t ihl = (size_t)(p[0] & 0x0F) * 4;
	size_t total = tap_be16(p + 2);
	if (total == 0)
		total = len + cut;
	size_t lost = ip_lost(total, len, cut);
	if (ihl < 20 || total < ihl || ihl > len || lost == SIZE_MAX)
		return false;
	total -= lost; /* the captured part */
	if ((tap_be16(p + 6) & 0x3FFF) != 0) {
		st->fragments++;
		return false;
	}
	if (p[9] != 6)
		return false;
	g->v6 = false;
	memcpy(g->src, p + 12, 4);
	memcpy(g->dst, p + 16, 4);
	return parse_tcp(g, p + ihl, total - ihl, lost);
}

/* RFC 8200 §4: hop-by-hop, routing, destination options and AH are skipped, and so is a fragment header that
 * holds the whole packet (offset 0, no more fragments: an atomic fragment); other fragments are counted. */
static bool parse_ipv6(struct tap_segment *g, struct tap_capture_stats *st, const uint8_t *p, size_t len,
		       size_t cut)
{
	if (len < 40 || (p[0] >> 4) != 6)
		return false;
	size_t plen = tap_be16(p + 4);
	size_t lost = ip_lost(40 + plen, len, cut);
	if (plen == 0 || lost == SIZE_MAX)
		return false;
	uint8_t nh = p[6];
	size_t off = 40, end = 40 + plen - lost; /* the captured part: every extension header must be in it */
	for (int i = 0; i < 16 && nh != 6; i++) {
		if (off + 8 > end)
			return false;
		size_t hl;
		if (nh == 0 || nh == 43 || nh == 60)
			hl = ((size_t)p[off + 1] + 1) * 8;
		else if (nh == 51)
			hl = ((size_t)p[off + 1] + 2) * 4;
		else if (nh == 44 && (tap_be16(p + off + 2) & 0xFFF9) == 0)
			hl = 8;
		else if (nh == 44) {
			st->fragments++;
			return false;
		} else
			return false;
		nh = p[off];
		off += hl;
	}
	if (nh != 6 || off > end)
		return false;
	g->v6 = true;
	memcpy(g->src, p + 8, 16);
	memcpy(g->dst, p + 24, 16);
	return parse_tcp(g, p + off, end - off, lost);
}

static bool parse_ip(struct tap_segment *g, struct tap_capture_stats *st, const uint8_t *p, size_t len, size_t cut)
{
	if (len < 1)
		return false;
	if ((p[0] >> 4) == 4)
		return parse_ipv4(g, st, p, len, cut);
	if ((p[0] >> 4) == 6)
		return parse_ipv6(g, st, p, len, cut);
	return false;
}

/* An EtherType and what follows it, behind any number of 802.1Q / 802.1ad tags (on Ethernet, and after a Linux
 * cooked header, where libpcap puts a tag the kernel took off back this way). */
static bool parse_ethertype(struct tap_segment *g, struct tap_capture_stats *st, uint16_t type, const uint8_t *p,
			    size_t len, size_t cut)
{
	size_t off = 0;
	while (type == 0x8100 || type == 0x88A8 || type == 0x9100) {
		if (off + 4 > len)
			return false;
		type = tap_be16(p + off + 2);
		off += 4;
	}
	if (type == 0x0800)
		return parse_ipv4(g, st, p + off, len - off, cut);
	if (type == 0x86DD)
		return parse_ipv6(g, st, p + off, len - off, cut);
	return false;
}

bool tap_capture_link_known(uint32_t linktype)
{
	switch (linktype) {
	case TAP_CAPTURE_LINK_ETHERNET:
	case TAP_CAPTURE_LINK_RAW:
	case TAP_CAPTURE_LINK_IPV4:
	case TAP_CAPTURE_LINK_IPV6:
	case TAP_CAPTURE_LINK_NULL:
	case TAP_CAPTURE_LINK_LOOP:
	case TAP_CAPTURE_LINK_LINUX_SLL:
	case TAP_CAPTURE_LINK_LINUX_SLL2:
		return true;
	default:
		return false;
	}
}

/* cut: the bytes of the packet its capture's snap length left out. */
static bool parse_link(struct tap_segment *g, struct tap_capture_stats *st, uint32_t linktype, const uint8_t *p,
		       size_t len, size_t cut)
{
	switch (linktype) {
	case TAP_CAPTURE_LINK_ETHERNET:
		return len >= 14 && parse_ethertype(g, st, tap_be16(p + 12), p + 14, len - 14, cut);
	case TAP_CAPTURE_LINK_RAW:
	case TAP_CAPTURE_LINK_IPV4:
	case TAP_CAPTURE_LINK_IPV6:
		return parse_ip(g, st, p, len, cut);
	case TAP_CAPTURE_LINK_NULL:
	case TAP_CAPTURE_LINK_LOOP: /* 4-byte address family, in either byte order: the IP version tells */
		return len >= 4 && parse_ip(g, st, p + 4, len - 4, cut);
	case TAP_CAPTURE_LINK_LINUX_SLL:
		return len >= 16 && parse_ethertype(g, st, tap_be16(p + 14), p + 16, len - 16, cut);
	case TAP_CAPTURE_LINK_LINUX_SLL2:
		return len >= 20 && parse_ethertype(g, st, tap_be16(p), p + 20, len - 20, cut);
	default:
		if (st->unknown_link++ == 0)
			st->unknown_linktype = linktype;
		return false;
	}
}

/* One packet, caplen bytes of the wire_len it had. A packet the snap length cut still delivers the payload bytes it
 * holds; the rest of its payload, as the IP length gives it, is a gap (reasm: tap_segment.lost). */
static int on_packet(struct tap_capture *c, uint32_t linktype, int64_t ts, const uint8_t *p, size_t caplen,
		     size_t wire_len)
{
	c->st.packets++;
	c->st.cut_short += caplen < wire_len;
	c->last_ts = ts;
	if (c->cb->packet)
		c->cb->packet(c->cb->ctx, ts);
	tap_reasm_packet_time(&c->reasm, ts);
	struct tap_segment g;
	if (!parse_link(&g, &c->st, linktype, p, caplen, caplen < wire_len ? wire_len - caplen : 0)) {
		c->st.skipped++;
		return TAP_OK;
	}
	return tap_reasm_segment(&c->reasm, &g, ts);
}

/* ---- classic pcap ---- */

static int pcap_run(struct tap_capture *c, char *err, size_t cap)
{
	uint8_t rh[16];
	for (;;) {
		idle_hint(c);
		uint64_t at = c->off;
		size_t n = stopping(c) ? 0 : src_read(c, rh, sizeof rh);
		if (n == 0 || (n < sizeof rh && stopping(c)))
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
			return stopping(c) ? TAP_OK
					   : fail(err, cap, TAP_E_BAD_CAPTURE, "%s: truncated record at offset %" PRIu64,
						  c->name, at);
		uint32_t frac = rd32(c, rh + 4);
		int64_t ts = (int64_t)rd32(c, rh) * 1000000 + (int64_t)(c->nsec ? frac / 1000 : frac);
		c->st.file_bytes = c->off;
		int rc = on_packet(c, c->linktype, ts, c->blk, incl, rd32(c, rh + 12));
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
			/* signed seconds; an offset past year 292,277 either way cannot be a real one */
			int64_t sec = (int64_t)o;
			f.offset_us = sec <= INT64_MAX / 1000000 && sec >= -(INT64_MAX / 1000000) ? sec * 1000000 : 0;
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
	size_t n = stopping(c) ? 0 : src_read(c, h, 8);
	if (n == 0 || (n < 8 && stopping(c)))
		return 0;
	if (n < 8)
		return fail(err, cap, TAP_E_BAD_CAPTURE, "%s: truncated block header at offset %" PRIu64, c->name, *at);
	uint32_t t;
	memcpy(&t, h, 4);
	if (t == PCAPNG_SHB) { /* §4.1: the byte-order magic decides how to read the rest of the section */
		if (src_read(c, h + 8, 4) < 4)
			return stopping(c) ? 0
					   : fail(err, cap, TAP_E_BAD_CAPTURE,
						  "%s: truncated section header at offset %" PRIu64, c->name, *at);
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
		return stopping(c) ? 0
				   : fail(err, cap, TAP_E_BAD_CAPTURE, "%s: truncated block at offset %" PRIu64, c->name,
					  *at);
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
		rc = on_packet(c, f->linktype, iface_ts(f, units), b + 20, caplen, rd32(c, b + 16));
		break;
	}
	case PCAPNG_SPB: { /* §4.4: no timestamp; interface 0 */
		if (len < 4 || c->n_ifs == 0)
			return fail(err, cap, TAP_E_BAD_CAPTURE, "%s: bad simple packet block at offset %" PRIu64,
				    c->name, at);
		uint32_t orig = rd32(c, b);
		size_t caplen = orig < len - 4 ? orig : len - 4;
		rc = on_packet(c, c->ifs[0].linktype, c->last_ts, b + 4, caplen, orig);
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

static int read_header(struct tap_capture *c, char *err, size_t cap)
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
	c->linktype = rd32(c, h + 20) & 0x03FFFFFF; /* bit 26: an FCS is present; the top 4: its length */
	return TAP_OK;
}

/* The header, unless a stop cut its read short: then the capture has no packets, and no error. */
static int open_common(struct tap_capture *c, char *err, size_t cap)
{
	int rc = read_header(c, err, cap);
	/* an interrupted read or one cut short by the end of the input, not a bad header */
	if (rc < 0 && src_state(c) != TAP_CAPTURE_SRC_OK && stopping(c)) {
		c->stopped_early = true;
		return TAP_OK;
	}
	return rc;
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
	c->waiter = (struct tap_capture_waiter){.ctx = c, .stop = waiter_stop};
	tap_reasm_init(&c->reasm, &c->st);
	tap_capture_set_limits(c, 0, 0);
	*out = c;
	return TAP_OK;
}

int tap_capture_open_src(struct tap_capture **out, const struct tap_capture_src_ops *ops, void *src, const char *name,
			 bool (*stop)(void *ctx), void *ctx, char *err, size_t cap)
{
	*out = NULL;
	struct tap_capture *c;
	if (capture_new(&c, name) < 0) {
		ops->close(src);
		return fail(err, cap, TAP_E_NOMEM, "out of memory");
	}
	c->ops = ops;
	c->src = src;
	c->open_stop = stop;
	c->open_ctx = ctx;
	int rc = open_common(c, err, cap);
	if (rc < 0) {
		tap_capture_free(c);
		return rc;
	}
	*out = c;
	return TAP_OK;
}

int tap_capture_new_stopped(struct tap_capture **out, const char *name)
{
	int rc = capture_new(out, name);
	if (rc == TAP_OK)
		(*out)->stopped_early = true;
	return rc;
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
	tap_reasm_deinit(&c->reasm);
	if (c->ops)
		c->ops->close(c->src);
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
	c->cb = cb ? cb : &none;
	if (c->cb->idle)
		c->waiter.idle = waiter_idle;
	c->reasm.ports[0] = port;
	c->reasm.cb = c->cb;
	if (c->stopped_early)
		return TAP_OK;
	int rc = c->fmt == FMT_PCAP ? pcap_run(c, err, cap) : pcapng_run(c, err, cap);
	if (rc == TAP_OK && src_state(c) == TAP_CAPTURE_SRC_ERROR && !stopping(c)) /* a stop's interrupted read: none */
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
	c->cb = cb ? cb : &none;
	c->reasm.ports[0] = port;
	c->reasm.cb = c->cb;
	*out = c;
	return TAP_OK;
}

int tap_capture_push(struct tap_capture *c, uint32_t linktype, int64_t ts_us, const uint8_t *packet, size_t caplen,
		     size_t wire_len)
{
	c->st.file_bytes += caplen;
	return on_packet(c, linktype, ts_us, packet, caplen, wire_len > caplen ? wire_len : caplen);
}

int tap_capture_add_port(struct tap_capture *c, uint16_t port)
{
	if (c->reasm.n_ports >= TAP_CAPTURE_MAX_PORTS)
		return TAP_E_USAGE;
	c->reasm.ports[c->reasm.n_ports++] = port;
	return TAP_OK;
}

int64_t tap_capture_known_until(const struct tap_capture *c)
{
	return tap_reasm_known_until(&c->reasm);
}

void tap_capture_advance(struct tap_capture *c, int64_t now)
{
	tap_reasm_expire_acks(&c->reasm, now);
}

void tap_capture_end_all(struct tap_capture *c)
{
	tap_reasm_close_all(&c->reasm, c->last_ts);
}

void tap_capture_set_limits(struct tap_capture *c, int64_t idle_us, size_t max_streams)
{
	c->reasm.idle_us = idle_us > 0 ? idle_us : TAP_CAPTURE_IDLE_US_DEFAULT;
	c->reasm.max_streams = max_streams > 0 ? max_streams : TAP_CAPTURE_MAX_STREAMS_DEFAULT;
}

void tap_capture_get_stats(const struct tap_capture *c, struct tap_capture_stats *s)
{
	*s = c->st;
}
