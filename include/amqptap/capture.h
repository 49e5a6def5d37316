/* Capture reader: classic pcap (both byte orders, µs and ns) and pcapng files, Ethernet/raw IP/Linux cooked/BSD
 * loopback link layers, IPv4 and IPv6, and TCP reassembly into ordered byte streams per direction for the
 * connections of one server port. Pure core: parses a memory buffer or the bytes a source hands it (a file, a pipe:
 * src/io/capfile.c), never reads a file, a socket or the clock itself. */
#ifndef AMQPTAP_CAPTURE_H
#define AMQPTAP_CAPTURE_H


#include "amqptap/dir.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Link types (https://www.tcpdump.org/linktypes.html) the reader understands. */
#define TAP_CAPTURE_LINK_NULL 0
#define TAP_CAPTURE_LINK_ETHERNET 1
#define TAP_CAPTURE_LINK_RAW 101
#define TAP_CAPTURE_LINK_LOOP 108
#define TAP_CAPTURE_LINK_LINUX_SLL 113
#define TAP_CAPTURE_LINK_IPV4 228
#define TAP_CAPTURE_LINK_IPV6 229
#define TAP_CAPTURE_LINK_LINUX_SLL2 276

/* Bounds: a block or record larger than this is a corrupt file; out-of-order data buffered per direction. */
#define TAP_CAPTURE_MAX_BLOCK (16u << 20)
#define TAP_CAPTURE_MAX_OOO_BYTES (4u << 20)
#define TAP_CAPTURE_MAX_OOO_SEGS 4096u
/* ... and in all streams together, counting each segment's bookkeeping too: past it, the least recently active
 * stream holding segments gives up its first hole. */
#define TAP_CAPTURE_MAX_OOO_TOTAL (64u << 20)
/* Broker ports one capture follows (a node's AMQP listeners, or several nodes on one host). */
#define TAP_CAPTURE_MAX_PORTS 16u
/* Stream limits (tap_capture_set_limits): an open stream that carries nothing for this long in capture time is
 * closed (an AMQP connection with the default 60 s heartbeat sends a frame at least every 30 s); at most this
 * many open streams, and as many closed ones remembered to drop their late packets. */
#define TAP_CAPTURE_IDLE_US_DEFAULT (600 * 1000000LL)
/* How long (capture time) bytes a peer acknowledged are awaited before the capture's lack of them is a gap. A
 * capture merged from two one-direction taps (mergecap) orders the directions by two clocks, so an ACK can come
 * before the segment it acknowledges by as much as the clocks differ: NTP keeps hosts on one LAN within about a
 * millisecond, so 10 ms tolerates that ten times over (and the kernel's and the taps' timestamping jitter, µs),
 * while a Return the capture did lose still ends its publish `unknown`: replay holds the tracker's deadlines
 * while bytes are awaited (tap_capture_known_until), so the wait delays records by at most this much. */
#define TAP_CAPTURE_REORDER_US (10 * 1000LL)
#define TAP_CAPTURE_MAX_STREAMS_DEFAULT 65536u
/* A stream that has carried no byte yet (a SYN, a handshake with nothing after it) is dropped after this long
 * without a packet: a client sends the AMQP protocol header at once, and RabbitMQ closes a connection that has not
 * finished its AMQP handshake within 10 s (handshake_timeout). If bytes come later, they start a mid-stream stream. */
#define TAP_CAPTURE_QUIET_IDLE_US (10 * 1000000LL)

/* How a stream ended. */
enum tap_capture_end {
	TAP_CAPTURE_END_CLIENT_FIN,  /* the client sent the first FIN; the stream ended at the second FIN, at a RST
					after the FIN, or at the end of the capture */
	TAP_CAPTURE_END_SERVER_FIN,
	TAP_CAPTURE_END_CLIENT_RST,  /* a RST before any FIN */
	TAP_CAPTURE_END_SERVER_RST,
	TAP_CAPTURE_END_CAPTURE,     /* still open at the end of the capture (or at a read error) */
	TAP_CAPTURE_END_IDLE,        /* nothing for the idle time: neither FIN nor RST was seen */
	TAP_CAPTURE_END_LIMIT,       /* the least recently active open stream when a new one exceeded the limit */
};

/* Callbacks of tap_capture_run; any may be NULL. `ctx` is passed to each, `user` is what open returned for the
 * stream. Address text is "ip:port" or "[v6]:port", valid only during the call. Data slices are valid only during
 * the call and arrive in order per direction, each byte once; ts_us is the Unix time (µs) of the packet that made
 * them deliverable. */
struct tap_capture_cb {
	void *ctx;
	/* Every packet of the capture, before anything it delivers (lets a caller advance its clock). */
	void (*packet)(void *ctx, int64_t ts_us);
	/* A new stream (stream numbers count from 1). midstream: no SYN was seen, so the bytes start wherever the
	 * capture started, possibly inside a frame. */
	void *(*open)(void *ctx, uint64_t stream, const char *client, const char *server, bool midstream,
		      int64_t ts_us);
	void (*data)(void *ctx, void *user, enum tap_dir dir, const uint8_t *data, size_t len, int64_t ts_us);
	/* Bytes of one direction were lost (out-of-order buffer bound exceeded): later data follows a hole. */
	void (*gap)(void *ctx, void *user, enum tap_dir dir, uint64_t missing, int64_t ts_us);
	/* The stream is over; user is not used again. */
	void (*close)(void *ctx, void *user, enum tap_capture_end how, int64_t ts_us);
	/* Reading a pipe or device (standard input): nothing more has arrived yet and the next read may wait, so what
	 * the caller holds back for a batch should go out now. */
	void (*idle)(void *ctx);
	/* Asked before each record and when a read was interrupted: true ends the capture there, as its end would (a
	 * signal asked the replay to stop). A record cut short by the stop is left out. */
	bool (*stop)(void *ctx);
};

#define TAP_CAPTURE_OTHER_PORTS 4

struct tap_capture_stats {
	uint64_t packets;       /* records/EPBs read */
	uint64_t tcp_packets;   /* TCP segments of the chosen port */
	uint64_t skipped;       /* packets not parsed: other link types, non-IP, non-TCP, fragments, truncated */
	uint64_t fragments;     /* of which IPv4 or IPv6 fragments (not reassembled) */
	uint64_t unknown_link;  /* of which of a link type not read, the first such one being unknown_linktype */
	uint32_t unknown_linktype;
	uint64_t streams;
	uint64_t bytes;         /* stream bytes delivered */
	uint64_t retransmitted; /* segments (or parts) dropped as already delivered */
	uint64_t out_of_order;  /* segments buffered ahead of a hole */
	uint64_t gaps;          /* holes given up on */
	uint64_t file_bytes;    /* bytes of the file consumed */
	uint64_t idle_closed;   /* streams ended with TAP_CAPTURE_END_IDLE */
	uint64_t evicted;       /* streams ended with TAP_CAPTURE_END_LIMIT */
	uint64_t quiet_dropped; /* streams dropped before their first byte (idle, or room needed): not in the above */
	uint64_t clock_steps;   /* packets whose time was ahead of every earlier one by the idle time or more */
	uint64_t clock_back;    /* packets whose time was behind an earlier one's by a second or more */
	uint64_t one_way;       /* streams that ended with client bytes and not one byte from the broker */
	uint64_t cut_short;     /* packets the capture's snap length cut (captured shorter than on the wire) */
	uint64_t other_tcp;     /* TCP segments of no broker port */
	/* the first TAP_CAPTURE_OTHER_PORTS server ports of those (a SYN's destination, else the lower port), with
	 * their segments: what --port may have been meant to be */
	struct {
		uint16_t port;
		uint64_t segments;
	} other_ports[TAP_CAPTURE_OTHER_PORTS];
};

struct tap_capture;

/* What the reader tells a source that may wait for its bytes, and asks it (the stop and idle of tap_capture_cb once
 * tap_capture_run runs; before, while the header is read, the opener's stop and no idle). */
struct tap_capture_waiter {
	void *ctx;
	bool (*stop)(void *ctx); /* a signal interrupted a read or a wait: true ends the input there */
	void (*idle)(void *ctx); /* NULL: no one to tell */
};

/* Where the bytes of a capture come from when they are not in memory (src/io/capfile.c: a file, a FIFO, a pipe). */
enum tap_capture_src_state {
	TAP_CAPTURE_SRC_OK,    /* every read so far was whole */
	TAP_CAPTURE_SRC_END,   /* a read came up short at the end of the input */
	TAP_CAPTURE_SRC_ERROR, /* a read failed (or a signal that said stop interrupted it) */
};
struct tap_capture_src_ops {
	/* Up to n bytes into buf (NULL when n is 0); fewer only at the end of the input, at a read error, or when a
	 * signal interrupted the read and w->stop said to stop. */
	size_t (*read)(void *src, void *buf, size_t n, const struct tap_capture_waiter *w);
	/* Before a record is read, when w->idle is set: returns once a byte is waiting, the next read would say what
	 * is wrong, or w->stop says to stop, calling w->idle at once and again while nothing comes. NULL: reads never
	 * wait. */
	void (*wait)(void *src, const struct tap_capture_waiter *w);
	enum tap_capture_src_state (*state)(void *src);
	void (*close)(void *src); /* at tap_capture_free */
};

/* Reads the header of a capture whose bytes src hands over (ops are borrowed, src is the capture's from now on,
 * closed by tap_capture_free or here on failure); name is used in messages. A signal that interrupts the header's
 * read asks stop(ctx) (it may also do what the signal asked), and once that says to stop, the capture is one without
 * packets, and no error. Returns 0 or a negative status (TAP_E_BAD_CAPTURE, TAP_E_NOMEM) with a message in err. */
int tap_capture_open_src(struct tap_capture **c, const struct tap_capture_src_ops *ops, void *src, const char *name,
			 bool (*stop)(void *ctx), void *ctx, char *err, size_t cap);
/* A capture without packets, for one whose input a stop came before (a FIFO that had no writer yet). */
int tap_capture_new_stopped(struct tap_capture **c, const char *name);
/* The same over a memory buffer, borrowed until tap_capture_free. */
int tap_capture_open_mem(struct tap_capture **c, const void *data, size_t len, const char *name, char *err,
			 size_t cap);
void tap_capture_free(struct tap_capture *c);
/* Sets the idle time (µs of capture time) and the stream limit; 0 takes the default. Call before tap_capture_run. */
void tap_capture_set_limits(struct tap_capture *c, int64_t idle_us, size_t max_streams);

/* Reads the whole capture, reassembling the TCP streams whose server port is `port` (the side with that port is
 * the broker; when both have it, the side that received the SYN, else the destination of the first segment).
 * Out-of-order segments are buffered (bounded), retransmissions and overlaps dropped. Streams end at RST, at the
 * second FIN, when idle or over the limit (tap_capture_set_limits), or at the end of the capture. Returns 0, or a negative status (TAP_E_BAD_CAPTURE with the file
 * offset in err, TAP_E_IO, TAP_E_NOMEM) after delivering everything before the fault and closing every open
 * stream. Call once per tap_capture. */
int tap_capture_run(struct tap_capture *c, uint16_t port, const struct tap_capture_cb *cb, char *err, size_t cap);

void tap_capture_get_stats(const struct tap_capture *c, struct tap_capture_stats *s);
/* One more broker port, besides the one tap_capture_run or tap_capture_new_push names; before the first packet.
 * TAP_E_USAGE past TAP_CAPTURE_MAX_PORTS. */
int tap_capture_add_port(struct tap_capture *c, uint16_t port);

/* Packets pushed one at a time (live capture, `amqptap sniff`): the same reassembly and callbacks as
 * tap_capture_run, for server port `port`; cb is borrowed until tap_capture_free. */
int tap_capture_new_push(struct tap_capture **c, uint16_t port, const struct tap_capture_cb *cb);
/* Whether packets of this link type (a LINKTYPE_ value) are read. */
bool tap_capture_link_known(uint32_t linktype);

/* One captured packet of link type `linktype` (TAP_CAPTURE_LINK_*), read only during the call: caplen bytes of the
 * wire_len it had (fewer when the snap length cut it: the rest of its payload is a gap). Returns 0 or TAP_E_NOMEM. */
int tap_capture_push(struct tap_capture *c, uint32_t linktype, int64_t ts_us, const uint8_t *packet, size_t caplen,
		     size_t wire_len);
/* The latest capture time before which every byte sent is known: bytes a peer acknowledged that the capture has
 * not had yet (awaited for TAP_CAPTURE_REORDER_US) were sent after their direction's last segment before them, so a
 * deadline up to then can be settled, a later one not yet (a Return among them would decide it). INT64_MAX when
 * nothing is awaited. */
int64_t tap_capture_known_until(const struct tap_capture *c);
/* The capture's clock reached now with no packet (a live capture gone quiet): acknowledged bytes awaited since
 * TAP_CAPTURE_REORDER_US before it are given up on (gap callbacks), as a packet at now would. */
void tap_capture_advance(struct tap_capture *c, int64_t now);
/* Ends every open stream as the end of a capture does (TAP_CAPTURE_END_CAPTURE unless a FIN was seen). */
void tap_capture_end_all(struct tap_capture *c);

#endif
