/* pcapng writer: synthetic Ethernet/IP/TCP packets carrying each connection's AMQP byte stream
 * (draft-ietf-opsawg-pcapng §4.1 SHB, §4.2 IDB, §4.3 EPB; RFC 791 IPv4, RFC 8200 IPv6, RFC 9293 TCP).
 * Blocks are built in a scratch buffer and handed whole to the caller's write function. */
#include "amqptap/pcapng.h"

#include "amqptap/buf.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

#define BT_SHB 0x0A0D0D0Au
#define BT_IDB 0x00000001u
#define BT_EPB 0x00000006u
#define BYTE_ORDER_MAGIC 0x1A2B3C4Du
#define LINKTYPE_ETHERNET 1
#define OPT_ENDOFOPT 0
#define OPT_SHB_USERAPPL 4
#define OPT_IF_TSRESOL 9

#define ETH_LEN 14
#define IP4_LEN 20
#define IP6_LEN 40
#define TCP_LEN 20

#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_PSH 0x08
#define TCP_ACK 0x10

struct tap_pcapng {
	tap_pcapng_write_fn write;
	void *write_ctx;
	struct tap_buf block;
	uint64_t conns;
	uint16_t ip_id;
};

struct endpoint {
	uint8_t addr[16]; /* IPv4 in the first 4 bytes, or IPv6 */
	uint16_t port;
	uint32_t next_seq;
};

struct tap_pcapng_conn {
	struct tap_pcapng *p;
	bool v6;
	bool sent_client_data;
	bool shaken;      /* its SYN, SYN-ACK, ACK are written: at its first packet, so the server can still move */
	bool client_v6;
	struct endpoint client; /* as parsed, before any mapping */
	int64_t opened_us; /* their time */
	struct endpoint ep[TAP_DIR_COUNT]; /* indexed by the direction its sender sends in: client at TAP_C2S */
};

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

static void put32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

/* Block fields are in the writer's byte order (the SHB magic tells readers which). */
static void host32(struct tap_buf *b, uint32_t v)
{
	tap_buf_append(b, &v, 4);
}

static void host16(struct tap_buf *b, uint16_t v)
{
	tap_buf_append(b, &v, 2);
}

static void pad4(struct tap_buf *b)
{
	static const uint8_t zero[4];
	tap_buf_append(b, zero, (4 - (b->len & 3)) & 3);
}

/* Starts a block of the given type at the end of b; returns where it starts, for block_close. */
static size_t block_open(struct tap_buf *b, uint32_t type)
{
	size_t start = b->len;
	host32(b, type);
	host32(b, 0);
	return start;
}

/* Appends the trailing total length and patches the leading one. */
static void block_close(struct tap_buf *b, size_t start)
{
	uint32_t total = (uint32_t)(b->len - start) + 4;
	host32(b, total);
	if (!b->oom)
		memcpy(b->data + start + 4, &total, 4);
}

/* Hands the block built in p->block to the writer. */
static void block_finish(struct tap_pcapng *p)
{
	block_close(&p->block, 0);
	if (!p->block.oom)
		p->write(p->write_ctx, p->block.data, p->block.len);
}

static void block_begin(struct tap_pcapng *p, uint32_t type)
{
	tap_buf_reset(&p->block);
	p->block.oom = false;
	(void)block_open(&p->block, type); /* at 0: block_finish closes it there */
}

bool tap_pcapng_head(struct tap_buf *out)
{
	/* §4.1 Section Header Block, section length unknown (-1). */
	size_t at = block_open(out, BT_SHB);
	host32(out, BYTE_ORDER_MAGIC);
	host16(out, 1);
	host16(out, 0);
	host32(out, 0xFFFFFFFFu);
	host32(out, 0xFFFFFFFFu);
	static const char appl[] = "amqptap " TAP_VERSION;
	host16(out, OPT_SHB_USERAPPL);
	host16(out, (uint16_t)(sizeof appl - 1));
	tap_buf_append(out, appl, sizeof appl - 1);
	pad4(out);
	host32(out, OPT_ENDOFOPT);
	block_close(out, at);

	/* §4.2 Interface Description Block: Ethernet, no snap limit, microsecond timestamps. */
	at = block_open(out, BT_IDB);
	host16(out, LINKTYPE_ETHERNET);
	host16(out, 0);
	host32(out, 0);
	host16(out, OPT_IF_TSRESOL);
	host16(out, 1);
	tap_buf_append(out, "\x06\0\0", 4);
	host32(out, OPT_ENDOFOPT);
	block_close(out, at);
	return !out->oom;
}

struct tap_pcapng *tap_pcapng_new_headless(tap_pcapng_write_fn write, void *ctx)
{
	struct tap_pcapng *p = calloc(1, sizeof *p);
	if (!p)
		return NULL;
	p->write = write;
	p->write_ctx = ctx;
	tap_buf_init(&p->block);
	return p;
}

struct tap_pcapng *tap_pcapng_new(tap_pcapng_write_fn write, void *ctx)
{
	struct tap_pcapng *p = tap_pcapng_new_headless(write, ctx);
	if (!p)
		return NULL;
	if (!tap_pcapng_head(&p->block)) {
		tap_pcapng_free(p);
		return NULL;
	}
	uint32_t shb_len; /* the head is two blocks, each handed over whole on its own */
	memcpy(&shb_len, p->block.data + 4, 4);
	write(ctx, p->block.data, shb_len);
	write(ctx, p->block.data + shb_len, p->block.len - shb_len);
	return p;
}

void tap_pcapng_free(struct tap_pcapng *p)
{
	if (!p)
		return;
	tap_buf_deinit(&p->block);
	free(p);
}

/* "1.2.3.4:5", "[::1]:5": false when the text is not a numeric address with a port. */
static bool parse_addr(const char *text, uint8_t addr[16], bool *v6, uint16_t *port)
{
	if (!text)
		return false;
	char host[64];
	const char *colon;
	size_t hlen;
	if (text[0] == '[') {
		const char *end = strchr(text, ']');
		if (!end || end[1] != ':')
			return false;
		hlen = (size_t)(end - text - 1);
		if (hlen >= sizeof host)
			return false;
		memcpy(host, text + 1, hlen);
		colon = end + 1;
	} else {
		colon = strrchr(text, ':');
		if (!colon)
			return false;
		hlen = (size_t)(colon - text);
		if (hlen >= sizeof host)
			return false;
		memcpy(host, text, hlen);
	}
	host[hlen] = '\0';
	char *e;
	unsigned long pv = strtoul(colon + 1, &e, 10);
	if (e == colon + 1 || *e != '\0' || pv > 65535)
		return false;
	memset(addr, 0, 16);
	if (inet_pton(AF_INET, host, addr) == 1)
		*v6 = false;
	else if (inet_pton(AF_INET6, host, addr) == 1)
		*v6 = true;
	else
		return false;
	*port = (uint16_t)pv;
	return true;
}

static void map_v4(uint8_t addr[16])
{
	uint8_t v4[4];
	memcpy(v4, addr, 4);
	memset(addr, 0, 16);
	addr[10] = addr[11] = 0xFF;
	memcpy(addr + 12, v4, 4);
}

/* RFC 1071 one's-complement sum. */
static uint32_t csum_add(uint32_t sum, const uint8_t *p, size_t len)
{
	while (len >= 2) {
		sum += (uint32_t)p[0] << 8 | p[1];
		p += 2;
		len -= 2;
	}
	if (len)
		sum += (uint32_t)p[0] << 8;
	return sum;
}

static uint16_t csum_fold(uint32_t sum)
{
	while (sum >> 16)
		sum = (sum & 0xFFFF) + (sum >> 16);
	return (uint16_t)~sum;
}

static void write_packet(struct tap_pcapng_conn *c, enum tap_dir dir, uint8_t flags, const uint8_t *data, size_t len,
			 int64_t ts_us)
{
	struct tap_pcapng *p = c->p;
	struct endpoint *src = &c->ep[dir], *dst = &c->ep[tap_dir_reverse(dir)];
	uint8_t hdr[ETH_LEN + IP6_LEN + TCP_LEN];
	size_t iplen = c->v6 ? IP6_LEN : IP4_LEN;
	size_t hlen = ETH_LEN + iplen + TCP_LEN;
	memset(hdr, 0, sizeof hdr);

	/* Ethernet II: locally administered MACs, 02:00:00:00:00:01 client, :02 broker. */
	hdr[0] = hdr[6] = 0x02;
	hdr[5] = dir == TAP_C2S ? 2 : 1;
	hdr[11] = dir == TAP_C2S ? 1 : 2;
	put16(hdr + 12, c->v6 ? 0x86DD : 0x0800);

	uint8_t *ip = hdr + ETH_LEN;
	uint8_t *tcp = ip + iplen;
	uint32_t sum = 0;
	if (c->v6) {
		ip[0] = 0x60;
		put16(ip + 4, (uint16_t)(TCP_LEN + len));
		ip[6] = 6;
		ip[7] = 64;
		memcpy(ip + 8, src->addr, 16);
		memcpy(ip + 24, dst->addr, 16);
		sum = csum_add(sum, ip + 8, 32); /* RFC 8200 §8.1 pseudo-header */
		sum += 6 + (uint32_t)(TCP_LEN + len);
	} else {
		ip[0] = 0x45;
		put16(ip + 2, (uint16_t)(IP4_LEN + TCP_LEN + len));
		put16(ip + 4, p->ip_id++);
		put16(ip + 6, 0x4000); /* DF */
		ip[8] = 64;
		ip[9] = 6;
		memcpy(ip + 12, src->addr, 4);
		memcpy(ip + 16, dst->addr, 4);
		put16(ip + 10, csum_fold(csum_add(0, ip, IP4_LEN)));
		sum = csum_add(sum, ip + 12, 8); /* RFC 9293 §3.1 pseudo-header */
		sum += 6 + (uint32_t)(TCP_LEN + len);
	}
	put16(tcp, src->port);
	put16(tcp + 2, dst->port);
	put32(tcp + 4, src->next_seq);
	if (flags & TCP_ACK)
		put32(tcp + 8, dst->next_seq);
	tcp[12] = (TCP_LEN / 4) << 4;
	tcp[13] = flags;
	put16(tcp + 14, 65535);
	sum = csum_add(sum, tcp, TCP_LEN);
	sum = csum_add(sum, data, len);
	put16(tcp + 16, csum_fold(sum));

	src->next_seq += (uint32_t)len + ((flags & (TCP_SYN | TCP_FIN)) ? 1 : 0);

	/* §4.3 Enhanced Packet Block on interface 0. */
	uint64_t ts = (uint64_t)ts_us;
	block_begin(p, BT_EPB);
	host32(&p->block, 0);
	host32(&p->block, (uint32_t)(ts >> 32));
	host32(&p->block, (uint32_t)ts);
	host32(&p->block, (uint32_t)(hlen + len));
	host32(&p->block, (uint32_t)(hlen + len));
	tap_buf_append(&p->block, hdr, hlen);
	tap_buf_append(&p->block, data, len);
	pad4(&p->block);
	block_finish(p);
}

/* The endpoints: the client as parsed (c->client), the server from its text; one that is not a numeric address is
 * a documentation address, and a v4/v6 mix is written IPv4-mapped. */
static void set_endpoints(struct tap_pcapng_conn *c, const char *server)
{
	struct endpoint *srv = &c->ep[TAP_S2C], *cli = &c->ep[TAP_C2S];
	bool srv_v6 = false;
	memset(srv->addr, 0, sizeof srv->addr);
	if (!parse_addr(server, srv->addr, &srv_v6, &srv->port)) {
		memcpy(srv->addr, (const uint8_t[4]){192, 0, 2, 2}, 4);
		srv->port = 5672;
	}
	memcpy(cli->addr, c->client.addr, sizeof cli->addr);
	cli->port = c->client.port;
	c->v6 = srv_v6 || c->client_v6;
	if (c->v6 && !srv_v6)
		map_v4(srv->addr);
	if (c->v6 && !c->client_v6)
		map_v4(cli->addr);
}

struct tap_pcapng_conn *tap_pcapng_conn_open(struct tap_pcapng *p, const char *client, const char *server,
					     int64_t ts_us)
{
	if (!p)
		return NULL;
	struct tap_pcapng_conn *c = calloc(1, sizeof *c);
	if (!c)
		return NULL;
	c->p = p;
	c->opened_us = ts_us;
	if (!parse_addr(client, c->client.addr, &c->client_v6, &c->client.port)) {
		memcpy(c->client.addr, (const uint8_t[4]){192, 0, 2, 1}, 4);
		c->client.port = 0;
	}
	set_endpoints(c, server);
	/* Deterministic, distinct initial sequence numbers per connection. */
	uint64_t n = ++p->conns;
	c->ep[TAP_C2S].next_seq = (uint32_t)(n * 0x9E3779B1u);
	c->ep[TAP_S2C].next_seq = (uint32_t)(n * 0x85EBCA77u + 0x1000u);
	return c;
}

void tap_pcapng_conn_begin(struct tap_pcapng_conn *c)
{
	if (!c || c->shaken)
		return;
	c->shaken = true;
	write_packet(c, TAP_C2S, TCP_SYN, NULL, 0, c->opened_us);
	write_packet(c, TAP_S2C, TCP_SYN | TCP_ACK, NULL, 0, c->opened_us);
	write_packet(c, TAP_C2S, TCP_ACK, NULL, 0, c->opened_us);
}

void tap_pcapng_conn_server(struct tap_pcapng_conn *c, const char *server)
{
	if (c && !c->shaken)
		set_endpoints(c, server);
}

void tap_pcapng_conn_data(struct tap_pcapng_conn *c, enum tap_dir dir, const uint8_t *data, size_t len, int64_t ts_us)
{
	if (!c || len == 0)
		return;
	tap_pcapng_conn_begin(c);
	/* Wireshark's AMQP dissector recognises the protocol header (0-9-1 §4.2.2) only in a packet of its own. */
	if (dir == TAP_C2S && !c->sent_client_data && len > 8 && memcmp(data, "AMQP", 4) == 0) {
		write_packet(c, TAP_C2S, TCP_PSH | TCP_ACK, data, 8, ts_us);
		data += 8;
		len -= 8;
	}
	if (dir == TAP_C2S && len)
		c->sent_client_data = true;
	while (len > 0) {
		size_t n = len < TAP_PCAPNG_MAX_SEGMENT ? len : TAP_PCAPNG_MAX_SEGMENT;
		write_packet(c, dir, TCP_PSH | TCP_ACK, data, n, ts_us);
		data += n;
		len -= n;
	}
}

void tap_pcapng_conn_close(struct tap_pcapng_conn *c, enum tap_pcapng_end how, int64_t ts_us)
{
	if (!c)
		return;
	tap_pcapng_conn_begin(c);
	enum tap_dir first = how == TAP_PCAPNG_BROKER_FIN || how == TAP_PCAPNG_BROKER_RST ? TAP_S2C : TAP_C2S;
	enum tap_dir other = first == TAP_C2S ? TAP_S2C : TAP_C2S;
	if (how == TAP_PCAPNG_CLIENT_RST || how == TAP_PCAPNG_BROKER_RST) {
		write_packet(c, first, TCP_RST | TCP_ACK, NULL, 0, ts_us);
	} else if (how != TAP_PCAPNG_OPEN) {
		write_packet(c, first, TCP_FIN | TCP_ACK, NULL, 0, ts_us);
		write_packet(c, other, TCP_ACK, NULL, 0, ts_us);
		write_packet(c, other, TCP_FIN | TCP_ACK, NULL, 0, ts_us);
		write_packet(c, first, TCP_ACK, NULL, 0, ts_us);
	}
	free(c);
}

enum tap_pcapng_end tap_pcapng_end_of(const char *how)
{
	if (!how)
		return TAP_PCAPNG_OPEN;
	if (strcmp(how, "client_eof") == 0)
		return TAP_PCAPNG_CLIENT_FIN;
	if (strcmp(how, "client_reset") == 0)
		return TAP_PCAPNG_CLIENT_RST;
	if (strcmp(how, "broker_reset") == 0)
		return TAP_PCAPNG_BROKER_RST;
	if (strcmp(how, "broker_eof") == 0)
		return TAP_PCAPNG_BROKER_FIN;
	return TAP_PCAPNG_OPEN;
}
