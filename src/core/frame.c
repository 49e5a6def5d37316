/* AMQP 0-9-1 push frame decoder, see frame.h. Input is consumed by a small state machine; when a whole
 * frame sits in the caller's input it is reported in place without copying (the common case). */
#include "amqptap/frame.h"

#include "amqptap/status.h"
#include "rd.h"

#include <stdlib.h>
#include <string.h>

/* The client protocol headers RabbitMQ accepts with AMQP 0-9-1 framing (rabbit_reader.erl handshake/2). */
static const struct protocol {
	uint8_t hdr[8];
	enum tap_amqp_version version;
	const char *name;
} protocols[] = {
	{{'A', 'M', 'Q', 'P', 0, 0, 9, 1}, TAP_AMQP_0_9_1, "0-9-1"},
	{{'A', 'M', 'Q', 'P', 1, 1, 0, 9}, TAP_AMQP_0_9_1, "0-9-1 (AMQP 1 1 0 9)"}, /* the 0-9 header */
	{{'A', 'M', 'Q', 'P', 1, 1, 8, 0}, TAP_AMQP_0_8, "0-8 (AMQP 1 1 8 0)"},
	{{'A', 'M', 'Q', 'P', 1, 1, 9, 1}, TAP_AMQP_0_8, "0-8 (AMQP 1 1 9 1)"}, /* 0-8 as the AMQP site printed it */
};
#define N_PROTOCOLS (sizeof protocols / sizeof protocols[0])

const char *tap_frame_protocol(const uint8_t hdr[8], enum tap_amqp_version *v)
{
	for (size_t i = 0; i < N_PROTOCOLS; i++) {
		if (memcmp(hdr, protocols[i].hdr, 8) == 0) {
			*v = protocols[i].version;
			return protocols[i].name;
		}
	}
	return NULL;
}

void tap_frame_dec_init(struct tap_frame_dec *d)
{
	memset(d, 0, sizeof *d);
	d->state = TAP_FRAME_ST_HEADER;
	tap_frame_dec_set_frame_max(d, TAP_FRAME_MAX_DEFAULT);
}

void tap_frame_dec_init_client(struct tap_frame_dec *d)
{
	tap_frame_dec_init(d);
	d->client = true;
	d->state = TAP_FRAME_ST_PROTOCOL;
}

void tap_frame_dec_deinit(struct tap_frame_dec *d)
{
	free(d->buf);
	d->buf = NULL;
	d->cap = 0;
}

/* frame_max counts the 8 bytes of header and end octet, so the payload may
 * be frame_max - 8; RabbitMQ accepts 8 bytes more (FRAME_SIZE_FUDGE,
 * PROTOCOL.md §3) and so does the tap: it must not stop decoding a stream
 * the broker accepts. */
void tap_frame_dec_set_frame_max(struct tap_frame_dec *d, uint32_t frame_max)
{
	d->frame_max = frame_max;
	uint32_t max = frame_max == 0 ? UINT32_MAX : frame_max - TAP_FRAME_OVERHEAD + TAP_FRAME_SIZE_FUDGE;
	uint32_t buffered = max < TAP_FRAME_BUFFER_MAX ? max : TAP_FRAME_BUFFER_MAX;
	d->payload_max[TAP_FRAME_METHOD] = buffered;
	d->payload_max[TAP_FRAME_HEADER] = buffered;
	d->payload_max[TAP_FRAME_BODY] = max;
}

void tap_frame_dec_set_version(struct tap_frame_dec *d, enum tap_amqp_version v)
{
	d->version = v;
}

int tap_frame_dec_error(const struct tap_frame_dec *d)
{
	return d->error;
}

uint64_t tap_frame_dec_error_offset(const struct tap_frame_dec *d)
{
	return d->error_offset;
}

uint64_t tap_frame_dec_offset(const struct tap_frame_dec *d)
{
	return d->offset;
}

bool tap_frame_dec_partial(const struct tap_frame_dec *d, struct tap_frame_partial *p)
{
	switch (d->state) {
	case TAP_FRAME_ST_HEADER:
		if (d->hdr_len == 0)
			return false;
		*p = (struct tap_frame_partial){.offset = d->frame_offset};
		return true;
	case TAP_FRAME_ST_PAYLOAD:
	case TAP_FRAME_ST_BODY:
	case TAP_FRAME_ST_END:
		*p = (struct tap_frame_partial){.offset = d->frame_offset, .type = d->type, .channel = d->channel};
		if (d->type == TAP_FRAME_METHOD && d->state != TAP_FRAME_ST_BODY && d->got >= 2)
			p->class_id = tap_be16(d->buf);
		return true;
	case TAP_FRAME_ST_PROTOCOL:
	case TAP_FRAME_ST_STOPPED:
		break;
	}
	return false;
}

static ssize_t fail(struct tap_frame_dec *d, int status, uint64_t offset)
{
	d->state = TAP_FRAME_ST_STOPPED;
	d->error = status;
	d->error_offset = offset;
	return status;
}

/* The largest payload of a frame of type 1..3. */
static uint32_t max_payload(const struct tap_frame_dec *d, unsigned type)
{
	return d->payload_max[type];
}

/* §4.2.3: type, channel, size; checks the type and the size bound before anything is buffered. */
static int check_header(struct tap_frame_dec *d, const uint8_t h[7])
{
	d->type = h[0];
	d->channel = tap_be16(h + 1);
	d->size = tap_be32(h + 3);
	d->got = 0;
	switch (d->type) {
	case TAP_FRAME_METHOD:
	case TAP_FRAME_HEADER:
	case TAP_FRAME_BODY:
		break;
	case TAP_FRAME_HEARTBEAT: /* §4.2.7: channel 0, no payload */
		if (d->channel != 0 || d->size != 0)
			return TAP_E_BAD_HEARTBEAT;
		break;
	default:
		return TAP_E_BAD_FRAME_TYPE;
	}
	if (d->type != TAP_FRAME_HEARTBEAT && d->size > max_payload(d, d->type))
		return TAP_E_FRAME_TOO_LARGE;
	return TAP_OK;
}

/* Room for `need` bytes of the current payload (need <= d->size): doubling, never past the payload size. */
static bool reserve(struct tap_frame_dec *d, uint32_t need)
{
	if (need <= d->cap)
		return true;
	size_t cap = d->cap ? d->cap : 512; /* only split method and header frames are collected here */
	while (cap < need)
		cap *= 2;
	if (cap > d->size)
		cap = d->size;
	uint8_t *p = realloc(d->buf, cap);
	if (!p)
		return false;
	d->buf = p;
	d->cap = cap;
	return true;
}

static void set_event(struct tap_frame_dec *d, struct tap_frame_ev *ev, const uint8_t *data, size_t len)
{
	static const enum tap_frame_ev_kind kinds[9] = {
		[TAP_FRAME_METHOD] = TAP_EV_METHOD,
		[TAP_FRAME_HEADER] = TAP_EV_HEADER,
		[TAP_FRAME_BODY] = TAP_EV_BODY,
		[TAP_FRAME_HEARTBEAT] = TAP_EV_HEARTBEAT,
	};
	ev->kind = kinds[d->type];
	ev->channel = d->channel;
	ev->type = d->type;
	ev->size = d->size;
	ev->offset = d->frame_offset;
	ev->data = data;
	ev->len = len;
	ev->frame_end = false;
	ev->version = d->version;
}

/* §4.2.2: collect the protocol header; reject as soon as the prefix matches no accepted header. */
static ssize_t feed_protocol(struct tap_frame_dec *d, const uint8_t *buf, size_t len, struct tap_frame_ev *ev)
{
	size_t n = 0;
	while (n < len && d->hdr_len < 8) {
		uint8_t c = buf[n];
		unsigned i = d->hdr_len;
		bool ok = !d->client && (i >= 4 || c == protocols[0].hdr[i]); /* the broker's: any version */
		for (size_t k = 0; k < N_PROTOCOLS && !ok && d->client; k++)
			ok = memcmp(d->hdr, protocols[k].hdr, i) == 0 && c == protocols[k].hdr[i];
		if (!ok)
			return fail(d, TAP_E_BAD_PROTOCOL_HEADER, d->offset + n);
		d->hdr[d->hdr_len++] = c;
		n++;
	}
	d->offset += n;
	if (d->hdr_len == 8) {
		if (d->client)
			(void)tap_frame_protocol(d->hdr, &d->version); /* matched above, so it is one of the table */
		ev->kind = TAP_EV_PROTOCOL_HEADER;
		ev->channel = 0;
		ev->type = 0;
		ev->size = 8;
		ev->offset = d->offset - 8;
		ev->data = d->hdr;
		ev->len = 8;
		ev->frame_end = false;
		ev->version = d->version;
		d->hdr_len = 0;
		d->state = TAP_FRAME_ST_HEADER;
	}
	return (ssize_t)n;
}

/* Everything but a whole frame at the start of the input: partial frames, protocol headers, heartbeats, errors. */
__attribute__((noinline)) static ssize_t feed_slow(struct tap_frame_dec *d, const uint8_t *buf, size_t len,
						  struct tap_frame_ev *ev)
{
	size_t pos = 0;
	int rc;
	ev->kind = TAP_EV_NONE;
	if (d->state == TAP_FRAME_ST_STOPPED)
		return TAP_E_DECODER_STOPPED;
	while (pos < len && ev->kind == TAP_EV_NONE) {
		const uint8_t *in = buf + pos;
		size_t avail = len - pos;
		switch (d->state) {
		case TAP_FRAME_ST_PROTOCOL: {
			ssize_t n = feed_protocol(d, in, avail, ev);
			if (n < 0)
				return n;
			pos += (size_t)n;
			break;
		}
		case TAP_FRAME_ST_HEADER:
			if (d->offset == 0 && d->hdr_len == 0 && in[0] == 'A') {
				d->state = TAP_FRAME_ST_PROTOCOL; /* the broker answering with its own header */
				break;
			}
			if (d->hdr_len == 0)
				d->frame_offset = d->offset;
			if (d->hdr_len == 0 && avail >= TAP_FRAME_HEADER_SIZE) {
				if ((rc = check_header(d, in)) < 0)
					return fail(d, rc, d->frame_offset);
				size_t whole = (size_t)TAP_FRAME_OVERHEAD + d->size;
				if (avail >= whole) { /* the whole frame is here: report it in place */
					if (in[whole - 1] != TAP_FRAME_END)
						return fail(d, TAP_E_BAD_FRAME_END, d->offset + whole - 1);
					set_event(d, ev, in + TAP_FRAME_HEADER_SIZE, d->size);
					ev->frame_end = true;
					d->offset += whole;
					pos += whole;
					break;
				}
				pos += TAP_FRAME_HEADER_SIZE;
				d->offset += TAP_FRAME_HEADER_SIZE;
			} else {
				size_t n = TAP_FRAME_HEADER_SIZE - d->hdr_len;
				if (n > avail)
					n = avail;
				memcpy(d->hdr + d->hdr_len, in, n);
				d->hdr_len = (uint8_t)(d->hdr_len + n);
				pos += n;
				d->offset += n;
				if (d->hdr_len < TAP_FRAME_HEADER_SIZE)
					break;
				d->hdr_len = 0;
				if ((rc = check_header(d, d->hdr)) < 0)
					return fail(d, rc, d->frame_offset);
			}
			if (d->type == TAP_FRAME_BODY) {
				d->state = TAP_FRAME_ST_BODY;
			} else if (d->size == 0) {
				d->state = TAP_FRAME_ST_END;
			} else {
				d->state = TAP_FRAME_ST_PAYLOAD;
			}
			break;
		case TAP_FRAME_ST_PAYLOAD: {
			size_t n = d->size - d->got;
			if (n > avail)
				n = avail;
			if (!reserve(d, d->got + (uint32_t)n))
				return fail(d, TAP_E_NOMEM, d->frame_offset);
			memcpy(d->buf + d->got, in, n);
			d->got += (uint32_t)n;
			pos += n;
			d->offset += n;
			if (d->got == d->size)
				d->state = TAP_FRAME_ST_END;
			break;
		}
		case TAP_FRAME_ST_BODY: {
			size_t n = d->size - d->got;
			if (n > avail)
				n = avail;
			d->got += (uint32_t)n;
			bool done = d->got == d->size;
			if (done && avail > n) {
				if (in[n] != TAP_FRAME_END)
					return fail(d, TAP_E_BAD_FRAME_END, d->offset + n);
				set_event(d, ev, in, n);
				ev->frame_end = true;
				pos += n + 1;
				d->offset += n + 1;
				d->state = TAP_FRAME_ST_HEADER;
				break;
			}
			if (n > 0)
				set_event(d, ev, in, n);
			pos += n;
			d->offset += n;
			if (done)
				d->state = TAP_FRAME_ST_END;
			break;
		}
		case TAP_FRAME_ST_END:
			if (in[0] != TAP_FRAME_END)
				return fail(d, TAP_E_BAD_FRAME_END, d->offset);
			if (d->type == TAP_FRAME_BODY)
				set_event(d, ev, in, 0);
			else
				set_event(d, ev, d->size ? d->buf : d->hdr, d->size);
			ev->frame_end = true;
			pos++;
			d->offset++;
			d->state = TAP_FRAME_ST_HEADER;
			break;
		case TAP_FRAME_ST_STOPPED:
			return TAP_E_DECODER_STOPPED;
		}
	}
	return (ssize_t)pos;
}

/* The fast path reports a whole method, header or body frame at the start of buf in place (§4.2.3). Its
 * checks are those of the slow path for that case: a type byte of 1..3 is never the 'A' of a protocol
 * header, so the offset-0 test is not needed. It leaves d->type, channel, size and frame_offset alone: they
 * describe a frame being assembled across feeds, and tap_frame_dec_partial reads them only then. */
ssize_t tap_frame_feed(struct tap_frame_dec *d, const uint8_t *buf, size_t len, struct tap_frame_ev *ev)
{
	if (d->state == TAP_FRAME_ST_HEADER && d->hdr_len == 0 && len >= TAP_FRAME_OVERHEAD) {
		unsigned type = buf[0];
		uint32_t size = tap_be32(buf + 3);
		if (type - TAP_FRAME_METHOD <= TAP_FRAME_BODY - TAP_FRAME_METHOD && size <= len - TAP_FRAME_OVERHEAD &&
		    size <= max_payload(d, type) && buf[TAP_FRAME_HEADER_SIZE + size] == TAP_FRAME_END) {
			_Static_assert(TAP_EV_METHOD - TAP_FRAME_METHOD == 1 && TAP_EV_HEADER - TAP_FRAME_HEADER == 1 &&
					       TAP_EV_BODY - TAP_FRAME_BODY == 1,
				       "frame type to event kind");
			ev->kind = (enum tap_frame_ev_kind)(type + 1);
			ev->channel = tap_be16(buf + 1);
			ev->type = (uint8_t)type;
			ev->size = size;
			ev->offset = d->offset;
			ev->data = buf + TAP_FRAME_HEADER_SIZE;
			ev->len = size;
			ev->frame_end = true;
			ev->version = d->version;
			d->offset += (size_t)TAP_FRAME_OVERHEAD + size;
			return (ssize_t)(TAP_FRAME_OVERHEAD + size);
		}
	}
	return feed_slow(d, buf, len, ev);
}
