/* Push decoder for one direction of an AMQP 0-9-1 byte stream (0-9-1 §4.2.2 protocol header, §4.2.3 frame
 * format, PROTOCOL.md §1-§3): it consumes whatever bytes arrive and reports one frame event at a time.
 * Method and header payloads are buffered up to frame_max; body payloads are never copied, only sliced.
 * AMQP 0-8, which RabbitMQ frames the same way, is decoded too; events say which version they belong to. */
#ifndef AMQPTAP_FRAME_H
#define AMQPTAP_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define TAP_FRAME_METHOD 1
#define TAP_FRAME_HEADER 2
#define TAP_FRAME_BODY 3
#define TAP_FRAME_HEARTBEAT 8
#define TAP_FRAME_END 0xCE
#define TAP_FRAME_HEADER_SIZE 7          /* type, channel, size */
#define TAP_FRAME_OVERHEAD 8             /* header + end octet: frame_max counts them */
#define TAP_FRAME_SIZE_FUDGE 8           /* RabbitMQ's tolerance above frame_max (PROTOCOL.md §3) */
#define TAP_FRAME_MAX_DEFAULT 131072     /* until tune-ok says otherwise */
#define TAP_FRAME_BUFFER_MAX (16u << 20) /* largest method/header payload buffered, whatever frame_max says */

/* The protocol version a connection speaks, fixed by the client's protocol header (PROTOCOL.md §1; RabbitMQ's
 * rabbit_reader version_negotiation): "AMQP" 0 0 9 1 and "AMQP" 1 1 0 9 are 0-9-1; "AMQP" 1 1 8 0 and
 * "AMQP" 1 1 9 1 are 0-8, which has the same frames (type, channel, size, payload, 0xCE; types 1, 2, 3, 8)
 * but numbers and lays out some methods differently (see dialect.h). */
enum tap_amqp_version {
	TAP_AMQP_0_9_1,
	TAP_AMQP_0_8,
};

enum tap_frame_ev_kind {
	TAP_EV_NONE,
	TAP_EV_PROTOCOL_HEADER,
	TAP_EV_METHOD,
	TAP_EV_HEADER,
	TAP_EV_BODY,
	TAP_EV_HEARTBEAT,
};

struct tap_frame_ev {
	enum tap_frame_ev_kind kind;
	uint16_t channel;
	uint8_t type;        /* wire frame type 1, 2, 3, 8 (0 for the protocol header) */
	uint32_t size;       /* payload size of the frame (8 for the protocol header) */
	uint64_t offset;     /* stream offset of the frame's first byte */
	const uint8_t *data; /* method/header/heartbeat/protocol header: the whole payload, valid until the next
				feed on this decoder (it may point into the caller's input or into the decoder);
				body: this slice of the body payload, pointing into the caller's input */
	size_t len;
	bool frame_end; /* body: this slice completes the frame and its 0xCE was verified. When the input ends
			   exactly before the end octet, the last slice has frame_end false and a later feed
			   reports an empty slice (len 0) with frame_end true. */
	enum tap_amqp_version version; /* of the connection, as the decoder knows it (see set_version) */
};

enum tap_frame_state {
	TAP_FRAME_ST_PROTOCOL, /* collecting the 8-byte protocol header */
	TAP_FRAME_ST_HEADER,   /* collecting the 7-byte frame header */
	TAP_FRAME_ST_PAYLOAD,  /* buffering a method/header/heartbeat payload */
	TAP_FRAME_ST_BODY,     /* slicing a body payload */
	TAP_FRAME_ST_END,      /* expecting the end octet */
	TAP_FRAME_ST_STOPPED,  /* an error was reported */
};

/* Caller-allocated; everything in it is private to frame.c. */
struct tap_frame_dec {
	enum tap_frame_state state;
	bool client;
	uint8_t hdr_len;
	uint8_t hdr[8];
	uint8_t type;
	uint16_t channel;
	uint32_t size;
	uint32_t got;
	uint32_t frame_max;
	uint64_t offset;       /* stream offset of the next byte */
	uint64_t frame_offset; /* stream offset of the current frame */
	uint64_t error_offset;
	int error;
	uint8_t *buf; /* payload buffer of a split method/header frame, grown as its bytes arrive; cap <= size */
	size_t cap;
	uint32_t payload_max[4]; /* largest payload by frame type 1..3 ([0] unused; see set_frame_max) */
	enum tap_amqp_version version;
};

/* Broker-to-client direction: frames from the first byte, except that an "AMQP" header at offset 0 (the
 * broker refusing our version) is reported as a protocol header event. Allocates nothing. */
void tap_frame_dec_init(struct tap_frame_dec *d);
/* Client-to-broker direction: the first 8 bytes must be one of the protocol headers of enum tap_amqp_version;
 * anything else is TAP_E_BAD_PROTOCOL_HEADER. The header sets the decoder's version. */
void tap_frame_dec_init_client(struct tap_frame_dec *d);
/* The version events are tagged with from now on: the broker side learns it from the client's header. */
void tap_frame_dec_set_version(struct tap_frame_dec *d, enum tap_amqp_version v);
/* The version of an 8-byte protocol header and its name for the frame trace ("0-9-1", "0-9-1 (AMQP 1 1 0 9)",
 * "0-8 (AMQP 1 1 8 0)", "0-8 (AMQP 1 1 9 1)"); NULL (and *v untouched) for any other 8 bytes. */
const char *tap_frame_protocol(const uint8_t hdr[8], enum tap_amqp_version *v);
void tap_frame_dec_deinit(struct tap_frame_dec *d);
/* From tune-ok; 0 = unlimited (bodies unbounded). A frame whose payload exceeds frame_max - 8 +
 * TAP_FRAME_SIZE_FUDGE is TAP_E_FRAME_TOO_LARGE, and so is a method or header payload above TAP_FRAME_BUFFER_MAX
 * whatever frame_max is: the client's tune-ok must not size the tap's memory. The buffer grows with the bytes
 * that arrive, never ahead of them. */
void tap_frame_dec_set_frame_max(struct tap_frame_dec *d, uint32_t frame_max);

/* Consumes a prefix of buf. Returns bytes consumed (>= 0) and sets ev->kind (TAP_EV_NONE when no event
 * completed in the consumed bytes; at most one event per call), or a negative status: TAP_E_BAD_PROTOCOL_HEADER,
 * TAP_E_BAD_FRAME_TYPE, TAP_E_FRAME_TOO_LARGE, TAP_E_BAD_FRAME_END, TAP_E_BAD_HEARTBEAT, TAP_E_NOMEM. After an
 * error every call returns TAP_E_DECODER_STOPPED. The caller loops until buf is used up. */
ssize_t tap_frame_feed(struct tap_frame_dec *d, const uint8_t *buf, size_t len, struct tap_frame_ev *ev);

/* The first error (0 if none) and the stream offset where it was detected: the mismatching byte of a
 * protocol header, the first byte of a frame with a bad type, size or heartbeat, the end octet itself. */
int tap_frame_dec_error(const struct tap_frame_dec *d);
uint64_t tap_frame_dec_error_offset(const struct tap_frame_dec *d);
/* Bytes consumed so far. */
uint64_t tap_frame_dec_offset(const struct tap_frame_dec *d);

/* A frame whose bytes have started to arrive but which has not been reported whole yet. */
struct tap_frame_partial {
	uint64_t offset;   /* stream offset of its first byte */
	uint8_t type;      /* 0 while its 7-byte header is still incomplete */
	uint16_t channel;  /* valid when type is not 0 */
	uint16_t class_id; /* a method's class-id once the first two payload bytes are in, else 0 (no class is 0) */
};
/* True and fills p while the decoder is inside a frame; false between frames, inside the protocol header, and
 * after an error. */
bool tap_frame_dec_partial(const struct tap_frame_dec *d, struct tap_frame_partial *p);

#endif
