/* pcapng writer for --pcap: the plaintext AMQP byte stream of every connection as synthetic Ethernet + IPv4/IPv6
 * + TCP packets between the real client and broker addresses, with valid checksums and TCP sequence numbers, so
 * Wireshark and tshark follow the streams (draft-ietf-opsawg-pcapng §4.1 SHB, §4.2 IDB, §4.3 EPB). */
#ifndef AMQPTAP_PCAPNG_H
#define AMQPTAP_PCAPNG_H


#include "amqptap/dir.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* TCP payload per packet: larger chunks are split so every packet fits an IPv4/IPv6 length field. */
#define TAP_PCAPNG_MAX_SEGMENT 65000u

struct tap_pcapng;
struct tap_pcapng_conn;

/* Receives one whole pcapng block per call; the slice is only read during the call. */
typedef void (*tap_pcapng_write_fn)(void *ctx, const void *block, size_t len);

struct tap_buf;

/* Appends the head every pcapng file, and every section of one, must begin with: the Section Header Block and one
 * Interface Description Block (LINKTYPE_ETHERNET, if_tsresol 6), which every packet block refers to. False when
 * out of memory. */
bool tap_pcapng_head(struct tap_buf *out);
/* Writes the head through write, then the packets of the connections. Every block goes out whole in one call, so
 * an output that drops whole blocks stays readable up to its last block. Returns NULL when out of memory. */
struct tap_pcapng *tap_pcapng_new(tap_pcapng_write_fn write, void *ctx);
/* The same without writing the head: for an output that puts tap_pcapng_head at the start of every file it opens
 * itself (tap_out_conf.head), as a file made again or reopened needs it too. */
struct tap_pcapng *tap_pcapng_new_headless(tap_pcapng_write_fn write, void *ctx);
/* Does not free the connections still open. */
void tap_pcapng_free(struct tap_pcapng *p);

/* One synthetic TCP connection: SYN, SYN-ACK, ACK at ts_us (written by tap_pcapng_conn_begin, else before its first
 * other packet). Addresses are "ip:port" or "[v6]:port"; text that is not a numeric address is written as 192.0.2.1
 * (client) / 192.0.2.2 (server); a v4/v6 mix uses IPv4-mapped IPv6. Returns NULL when out of memory; the other
 * calls accept NULL and do nothing. */
struct tap_pcapng_conn *tap_pcapng_conn_open(struct tap_pcapng *p, const char *client, const char *server,
					     int64_t ts_us);
/* Writes c's handshake now, if not yet: a reader numbers connections in the order their handshakes come. */
void tap_pcapng_conn_begin(struct tap_pcapng_conn *c);
/* The server is another address (the proxy's next one), before any packet of c was written; ignored after. */
void tap_pcapng_conn_server(struct tap_pcapng_conn *c, const char *server);
/* One packet per call (several when len > TAP_PCAPNG_MAX_SEGMENT); len 0 writes nothing. */
void tap_pcapng_conn_data(struct tap_pcapng_conn *c, enum tap_dir dir, const uint8_t *data, size_t len, int64_t ts_us);
/* How a connection ended, as its capture shows it (a replay of the file gives the same end). */
enum tap_pcapng_end {
	TAP_PCAPNG_CLIENT_FIN, /* FIN from the client, ACK, FIN from the broker, ACK */
	TAP_PCAPNG_BROKER_FIN, /* the same, the broker first */
	TAP_PCAPNG_CLIENT_RST, /* a reset from the client */
	TAP_PCAPNG_BROKER_RST, /* a reset from the broker */
	TAP_PCAPNG_OPEN,       /* nothing: neither peer ended it (the tap stopped, the capture ended, TLS failed, ...) */
};
/* The end of a connection that ended `how` (tap_conn_end's reason: "client_eof", "broker_reset", ...): only what a
 * peer did is written, so a replay of the file does not blame the client for a close the tap made. */
enum tap_pcapng_end tap_pcapng_end_of(const char *how);
/* Writes the end and frees c. */
void tap_pcapng_conn_close(struct tap_pcapng_conn *c, enum tap_pcapng_end how, int64_t ts_us);

#endif
