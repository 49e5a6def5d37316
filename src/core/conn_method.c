/* Decoded methods of both directions onto the tracker's events (0-9-1 §4.2.4 and the class sections), and what the
 * connection's own state takes from them: login, vhost, frame_max. */
#include "conn_int.h"

#include "amqptap/consume.h"
#include "amqptap/dialect.h"
#include "amqptap/sasl.h"
#include "amqptap/status.h"
#include "amqptap/table.h"

#include <stdlib.h>
#include <string.h>

static struct tap_slice arg_slice(const struct tap_method *m, int idx)
{
	return (struct tap_slice){m->args[idx].ptr, m->args[idx].len};
}

/* The frame_max both decoders apply once the client's tune-ok came: its value, never above the broker's tune, nor
 * above TAP_FRAME_MAX_DEFAULT while that tune was not seen (a client that sends its tune-ok before the broker asked
 * is not to size the tap's buffers: it is applied again when the tune comes). */
static void set_frame_max(struct tap_conn *c)
{
	uint32_t frame_max = c->client_frame_max;
	uint32_t ceiling = c->broker_tuned ? c->broker_frame_max : TAP_FRAME_MAX_DEFAULT;
	if (ceiling && (frame_max == 0 || frame_max > ceiling))
		frame_max = ceiling;
	c->frame_max = frame_max;
	c->tuned = true;
	tap_frame_dec_set_frame_max(&c->dir[TAP_S2C].dec, frame_max);
	tap_frame_dec_set_frame_max(&c->dir[TAP_C2S].dec, frame_max);
}

/* A client property that is a string (S, or x as RabbitMQ's clients never send it); empty otherwise. */
static struct tap_slice client_prop(struct tap_slice props, const char *key)
{
	struct tap_field f;
	if (!tap_table_find(props.ptr, props.len, key, &f) || (f.type != 'S' && f.type != 'x'))
		return (struct tap_slice){NULL, 0};
	return (struct tap_slice){f.ptr, f.len};
}

/* The capabilities a client advertises that say how it handles a publish's fate (0-9-1 has no such table: it is
 * RabbitMQ's, PROTOCOL.md): each a boolean in the "capabilities" table of its client properties. */
static const struct {
	const char *key;
	unsigned bit;
} client_cap_keys[] = {
	{"connection.blocked", TAP_TRACK_CAP_CONNECTION_BLOCKED},
	{"publisher_confirms", TAP_TRACK_CAP_PUBLISHER_CONFIRMS},
	{"consumer_cancel_notify", TAP_TRACK_CAP_CONSUMER_CANCEL_NOTIFY},
	{"basic.nack", TAP_TRACK_CAP_BASIC_NACK},
};

static void client_caps(struct tap_conn *c, struct tap_slice props)
{
	struct tap_field f;
	unsigned present = 0, caps = 0;
	bool has = tap_table_find(props.ptr, props.len, "capabilities", &f) && f.type == 'F';
	for (size_t i = 0; has && i < sizeof client_cap_keys / sizeof client_cap_keys[0]; i++) {
		struct tap_field b;
		if (!tap_table_find(f.ptr, f.len, client_cap_keys[i].key, &b) || b.type != 't')
			continue;
		present |= client_cap_keys[i].bit;
		if (b.i)
			caps |= client_cap_keys[i].bit;
	}
	tap_track_conn_client_caps(c->tc, client_prop(props, "connection_name"), has, present, caps);
}

static void on_start_ok(struct tap_conn *c, const struct tap_method *m)
{
	struct tap_slice props = arg_slice(m, TAP_ARG_CONNECTION_START_OK_CLIENT_PROPERTIES);
	struct tap_slice version = client_prop(props, "version");
	if (!version.ptr) /* py-amqp (Celery, kombu) names it product_version */
		version = client_prop(props, "product_version");
	tap_track_conn_client_props(c->tc, client_prop(props, "product"), version, client_prop(props, "platform"));
	client_caps(c, props);
	struct tap_sasl sasl;
	tap_sasl_parse(arg_slice(m, TAP_ARG_CONNECTION_START_OK_MECHANISM),
		       arg_slice(m, TAP_ARG_CONNECTION_START_OK_RESPONSE), &sasl);
	if (sasl.user.len)
		tap_track_conn_user(c->tc, sasl.user);
}

/* The client's side of consuming (0-9-1 §1.8.3): onto the consumer tracker (amqptap/consume.h). Consumer acks are
 * the client's basic.ack/nack, a tag space of their own (PROTOCOL §8). */
static void on_client_consumer_method(struct tap_conn *c, uint16_t channel, const struct tap_method *m,
				      int64_t now_us)
{
	struct tap_track_conn *tc = c->tc;
	switch (m->def->id) {
	case TAP_BASIC_QOS:
		tap_consume_qos(tc, channel, (uint16_t)m->args[TAP_ARG_BASIC_QOS_PREFETCH_COUNT].u,
				m->args[TAP_ARG_BASIC_QOS_GLOBAL].u != 0, now_us);
		break;
	case TAP_BASIC_CONSUME:
		tap_consume_consume(tc, channel, arg_slice(m, TAP_ARG_BASIC_CONSUME_CONSUMER_TAG),
				    arg_slice(m, TAP_ARG_BASIC_CONSUME_QUEUE), m->args[TAP_ARG_BASIC_CONSUME_NO_ACK].u != 0,
				    m->args[TAP_ARG_BASIC_CONSUME_EXCLUSIVE].u != 0,
				    m->args[TAP_ARG_BASIC_CONSUME_NO_WAIT].u != 0, now_us);
		break;
	case TAP_BASIC_CANCEL:
		tap_consume_cancel(tc, channel, arg_slice(m, TAP_ARG_BASIC_CANCEL_CONSUMER_TAG), TAP_BY_CLIENT,
				   m->args[TAP_ARG_BASIC_CANCEL_NO_WAIT].u != 0, now_us);
		break;
	case TAP_BASIC_GET:
		tap_consume_get(tc, channel, arg_slice(m, TAP_ARG_BASIC_GET_QUEUE),
				m->args[TAP_ARG_BASIC_GET_NO_ACK].u != 0, now_us);
		break;
	case TAP_BASIC_ACK:
		tap_consume_settle(tc, channel, TAP_CONSUME_ACK, m->args[TAP_ARG_BASIC_ACK_DELIVERY_TAG].u,
				   m->args[TAP_ARG_BASIC_ACK_MULTIPLE].u != 0, false, now_us);
		break;
	case TAP_BASIC_NACK:
		tap_consume_settle(tc, channel, TAP_CONSUME_NACK, m->args[TAP_ARG_BASIC_NACK_DELIVERY_TAG].u,
				   m->args[TAP_ARG_BASIC_NACK_MULTIPLE].u != 0,
				   m->args[TAP_ARG_BASIC_NACK_REQUEUE].u != 0, now_us);
		break;
	case TAP_BASIC_REJECT:
		tap_consume_settle(tc, channel, TAP_CONSUME_REJECT, m->args[TAP_ARG_BASIC_REJECT_DELIVERY_TAG].u, false,
				   m->args[TAP_ARG_BASIC_REJECT_REQUEUE].u != 0, now_us);
		break;
	case TAP_BASIC_RECOVER:
		tap_consume_recover(tc, channel, m->args[TAP_ARG_BASIC_RECOVER_REQUEUE].u != 0, now_us);
		break;
	case TAP_BASIC_RECOVER_ASYNC:
		tap_consume_recover(tc, channel, m->args[TAP_ARG_BASIC_RECOVER_ASYNC_REQUEUE].u != 0, now_us);
		break;
	default:
		break;
	}
}

/* A basic.deliver or get-ok: its content is assembled like a publish's (conn_content.c), then handed on; on a
 * channel with no state (past the memory budget) it is handed on at its method, its content not read: every
 * delivery still gets its record. */
static void start_delivery(struct tap_conn *c, uint16_t channel, const struct tap_method *m, bool get,
			   int64_t now_us)
{
	struct tap_delivery d = {.get = get};
	if (get) {
		d.delivery_tag = m->args[TAP_ARG_BASIC_GET_OK_DELIVERY_TAG].u;
		d.redelivered = m->args[TAP_ARG_BASIC_GET_OK_REDELIVERED].u != 0;
		d.exchange = arg_slice(m, TAP_ARG_BASIC_GET_OK_EXCHANGE);
		d.routing_key = arg_slice(m, TAP_ARG_BASIC_GET_OK_ROUTING_KEY);
	} else {
		d.consumer_tag = arg_slice(m, TAP_ARG_BASIC_DELIVER_CONSUMER_TAG);
		d.delivery_tag = m->args[TAP_ARG_BASIC_DELIVER_DELIVERY_TAG].u;
		d.redelivered = m->args[TAP_ARG_BASIC_DELIVER_REDELIVERED].u != 0;
		d.exchange = arg_slice(m, TAP_ARG_BASIC_DELIVER_EXCHANGE);
		d.routing_key = arg_slice(m, TAP_ARG_BASIC_DELIVER_ROUTING_KEY);
	}
	struct channel *ch = conn_channel_get(c, channel, now_us);
	if (!ch) {
		d.unfollowed = d.header_lost = true;
		tap_consume_deliver(c->tc, channel, &d, now_us);
		return;
	}
	struct pending *p = &ch->dir[TAP_S2C];
	conn_pending_reset(c, p, PENDING_DELIVER);
	p->get = get;
	p->delivery_tag = d.delivery_tag;
	p->redelivered = d.redelivered;
	if (!get)
		p->reply_text = conn_keep(c, p, d.consumer_tag.ptr, d.consumer_tag.len);
	p->exchange = conn_keep(c, p, d.exchange.ptr, d.exchange.len);
	p->routing_key = conn_keep(c, p, d.routing_key.ptr, d.routing_key.len);
}

/* The broker's side of consuming. */
static void on_broker_consumer_method(struct tap_conn *c, uint16_t channel, const struct tap_method *m,
				      int64_t now_us)
{
	struct tap_track_conn *tc = c->tc;
	switch (m->def->id) {
	case TAP_BASIC_CONSUME_OK:
		tap_consume_consume_ok(tc, channel, arg_slice(m, TAP_ARG_BASIC_CONSUME_OK_CONSUMER_TAG), now_us);
		break;
	case TAP_BASIC_CANCEL: /* the queue was deleted (consumer_cancel_notify) */
		tap_consume_cancel(tc, channel, arg_slice(m, TAP_ARG_BASIC_CANCEL_CONSUMER_TAG), TAP_BY_BROKER, true,
				   now_us);
		break;
	case TAP_BASIC_CANCEL_OK:
		tap_consume_cancel_ok(tc, channel, arg_slice(m, TAP_ARG_BASIC_CANCEL_OK_CONSUMER_TAG), now_us);
		break;
	case TAP_BASIC_DELIVER:
		start_delivery(c, channel, m, false, now_us);
		break;
	case TAP_BASIC_GET_OK:
		start_delivery(c, channel, m, true, now_us);
		break;
	case TAP_BASIC_GET_EMPTY:
		tap_consume_get_empty(tc, channel, now_us);
		break;
	default:
		break;
	}
}

/* Client -> broker methods (0-9-1 §4.2.4 and the class sections). */
static void on_client_method(struct tap_conn *c, uint16_t channel, const struct tap_method *m, int64_t now_us)
{
	struct tap_track_conn *tc = c->tc;
	switch (m->def->id) {
	case TAP_CONNECTION_START_OK:
		on_start_ok(c, m);
		break;
	case TAP_CONNECTION_TUNE_OK:
		c->login_done = true;
		tap_track_conn_tune(tc, (uint16_t)m->args[TAP_ARG_CONNECTION_TUNE_OK_CHANNEL_MAX].u,
				    (uint32_t)m->args[TAP_ARG_CONNECTION_TUNE_OK_FRAME_MAX].u,
				    (uint16_t)m->args[TAP_ARG_CONNECTION_TUNE_OK_HEARTBEAT].u);
		c->client_frame_max = (uint32_t)m->args[TAP_ARG_CONNECTION_TUNE_OK_FRAME_MAX].u;
		set_frame_max(c);
		break;
	case TAP_CONNECTION_OPEN: {
		c->login_done = true;
		struct tap_slice v = arg_slice(m, TAP_ARG_CONNECTION_OPEN_VIRTUAL_HOST); /* a shortstr: 255 bytes at most */
		free(c->vhost);
		c->vhost = malloc(v.len ? v.len : 1);
		c->vhost_len = c->vhost ? v.len : 0;
		c->vhost_lost = !c->vhost;
		if (c->vhost_len)
			memcpy(c->vhost, v.ptr, c->vhost_len);
		break;
	}
	case TAP_CONNECTION_CLOSE:
		tap_track_conn_close(tc, TAP_BY_CLIENT, (uint16_t)m->args[TAP_ARG_CONNECTION_CLOSE_REPLY_CODE].u,
				     arg_slice(m, TAP_ARG_CONNECTION_CLOSE_REPLY_TEXT), now_us);
		break;
	case TAP_CHANNEL_OPEN:
		/* a number opened again: what the consumer tracker kept of it is over */
		tap_consume_channel_close(tc, channel, TAP_BY_CLIENT, 0, (struct tap_slice){NULL, 0}, now_us);
		tap_track_channel_open(tc, channel, now_us);
		break;
	case TAP_CHANNEL_CLOSE:
		tap_track_channel_close(tc, channel, TAP_BY_CLIENT, (uint16_t)m->args[TAP_ARG_CHANNEL_CLOSE_REPLY_CODE].u,
					arg_slice(m, TAP_ARG_CHANNEL_CLOSE_REPLY_TEXT), now_us);
		tap_consume_channel_close(tc, channel, TAP_BY_CLIENT,
					  (uint16_t)m->args[TAP_ARG_CHANNEL_CLOSE_REPLY_CODE].u,
					  arg_slice(m, TAP_ARG_CHANNEL_CLOSE_REPLY_TEXT), now_us);
		break;
	case TAP_CHANNEL_CLOSE_OK: /* to the broker's close: the consumer side ended there unless it was not seen */
		if (tap_track_channel_fault_close_wait(tc, channel, TAP_BY_CLIENT))
			break; /* --fault close-channel: to the close the tap showed it; the broker's close-ok is to come */
		tap_consume_channel_close(tc, channel, TAP_BY_BROKER, 0, (struct tap_slice){NULL, 0}, now_us);
		tap_track_channel_close_ok(tc, channel, now_us);
		conn_channel_drop(c, channel);
		break;
	case TAP_CONFIRM_SELECT:
		tap_track_confirm_select(tc, channel, now_us);
		break;
	case TAP_TX_SELECT:
		tap_track_tx_select(tc, channel, now_us);
		break;
	case TAP_TX_COMMIT:
		tap_track_tx_end(tc, channel, TAP_TRACK_TX_COMMIT, now_us);
		break;
	case TAP_TX_ROLLBACK:
		tap_track_tx_end(tc, channel, TAP_TRACK_TX_ROLLBACK, now_us);
		break;
	case TAP_BASIC_PUBLISH: {
		struct tap_slice x = arg_slice(m, TAP_ARG_BASIC_PUBLISH_EXCHANGE);
		struct tap_slice rk = arg_slice(m, TAP_ARG_BASIC_PUBLISH_ROUTING_KEY);
		struct channel *ch = conn_channel_get(c, channel, now_us);
		if (!ch) { /* no memory to assemble its content in: it still counts, its details lost */
			struct tap_publish pub = {.mandatory = m->args[TAP_ARG_BASIC_PUBLISH_MANDATORY].u != 0,
			                          .immediate = m->args[TAP_ARG_BASIC_PUBLISH_IMMEDIATE].u != 0,
			                          .details_lost = true,
			                          .header_lost = true};
			tap_track_publish(tc, channel, &pub, now_us);
			break;
		}
		struct pending *p = &ch->dir[TAP_C2S];
		conn_pending_reset(c, p, PENDING_PUBLISH);
		p->exchange = conn_keep(c, p, x.ptr, x.len);
		p->routing_key = conn_keep(c, p, rk.ptr, rk.len);
		p->mandatory = m->args[TAP_ARG_BASIC_PUBLISH_MANDATORY].u != 0;
		p->immediate = m->args[TAP_ARG_BASIC_PUBLISH_IMMEDIATE].u != 0;
		break;
	}
	default:
		on_client_consumer_method(c, channel, m, now_us);
		break;
	}
}

/* Broker -> client methods. */
static void on_broker_method(struct tap_conn *c, uint16_t channel, const struct tap_method *m, int64_t now_us)
{
	struct tap_track_conn *tc = c->tc;
	switch (m->def->id) {
	case TAP_CONNECTION_TUNE:
		c->broker_frame_max = (uint32_t)m->args[TAP_ARG_CONNECTION_TUNE_FRAME_MAX].u;
		c->broker_tuned = true;
		if (c->tuned) /* the client answered first */
			set_frame_max(c);
		break;
	case TAP_CONNECTION_OPEN_OK: {
		/* a NULL vhost: the decoder lost it; none seen (a capture begun after the open): empty, as before */
		const uint8_t *vhost = c->vhost_lost ? NULL : c->vhost ? (const uint8_t *)c->vhost : (const uint8_t *)"";
		tap_track_conn_open(tc, (struct tap_slice){vhost, c->vhost_len}, now_us);
		free(c->vhost);
		c->vhost = NULL;
		c->vhost_len = 0;
		break;
	}
	case TAP_CONNECTION_CLOSE_OK:
		tap_track_conn_close_ok(tc, now_us);
		break;
	case TAP_CONNECTION_CLOSE:
		tap_track_conn_close(tc, TAP_BY_BROKER, (uint16_t)m->args[TAP_ARG_CONNECTION_CLOSE_REPLY_CODE].u,
				     arg_slice(m, TAP_ARG_CONNECTION_CLOSE_REPLY_TEXT), now_us);
		if (m->args[TAP_ARG_CONNECTION_CLOSE_CLASS_ID].u == TAP_CLASS_BASIC &&
		    m->args[TAP_ARG_CONNECTION_CLOSE_METHOD_ID].u == (TAP_BASIC_PUBLISH & 0xFFFF))
			tap_track_publish_refused(tc, 0, now_us);
		break;
	case TAP_CONNECTION_BLOCKED:
		tap_track_conn_blocked(tc, arg_slice(m, TAP_ARG_CONNECTION_BLOCKED_REASON), now_us);
		break;
	case TAP_CONNECTION_UNBLOCKED:
		tap_track_conn_unblocked(tc, now_us);
		break;
	case TAP_CHANNEL_CLOSE:
		tap_consume_channel_close(tc, channel, TAP_BY_BROKER,
					  (uint16_t)m->args[TAP_ARG_CHANNEL_CLOSE_REPLY_CODE].u,
					  arg_slice(m, TAP_ARG_CHANNEL_CLOSE_REPLY_TEXT), now_us);
		tap_track_channel_close(tc, channel, TAP_BY_BROKER, (uint16_t)m->args[TAP_ARG_CHANNEL_CLOSE_REPLY_CODE].u,
					arg_slice(m, TAP_ARG_CHANNEL_CLOSE_REPLY_TEXT), now_us);
		if (m->args[TAP_ARG_CHANNEL_CLOSE_CLASS_ID].u == TAP_CLASS_BASIC &&
		    m->args[TAP_ARG_CHANNEL_CLOSE_METHOD_ID].u == (TAP_BASIC_PUBLISH & 0xFFFF))
			tap_track_publish_refused(tc, channel, now_us);
		break;
	case TAP_CHANNEL_OPEN_OK:
		tap_track_channel_open_ok(tc, channel, now_us);
		break;
	case TAP_CHANNEL_CLOSE_OK:
		if (tap_track_channel_fault_close_wait(tc, channel, TAP_BY_BROKER))
			break; /* --fault close-channel: to the tap's close; the client's close-ok is to come */
		tap_consume_channel_close(tc, channel, TAP_BY_CLIENT, 0, (struct tap_slice){NULL, 0}, now_us);
		tap_track_channel_close_ok(tc, channel, now_us);
		conn_channel_drop(c, channel);
		break;
	case TAP_TX_COMMIT_OK:
		tap_track_tx_end_ok(tc, channel, TAP_TRACK_TX_COMMIT, now_us);
		break;
	case TAP_TX_ROLLBACK_OK:
		tap_track_tx_end_ok(tc, channel, TAP_TRACK_TX_ROLLBACK, now_us);
		break;
	case TAP_BASIC_ACK:
		tap_track_ack(tc, channel, m->args[TAP_ARG_BASIC_ACK_DELIVERY_TAG].u,
			      m->args[TAP_ARG_BASIC_ACK_MULTIPLE].u != 0, now_us);
		break;
	case TAP_BASIC_NACK:
		tap_track_nack(tc, channel, m->args[TAP_ARG_BASIC_NACK_DELIVERY_TAG].u,
			       m->args[TAP_ARG_BASIC_NACK_MULTIPLE].u != 0, now_us);
		break;
	case TAP_BASIC_RETURN: {
		struct tap_slice text = arg_slice(m, TAP_ARG_BASIC_RETURN_REPLY_TEXT);
		struct tap_slice x = arg_slice(m, TAP_ARG_BASIC_RETURN_EXCHANGE);
		struct tap_slice rk = arg_slice(m, TAP_ARG_BASIC_RETURN_ROUTING_KEY);
		struct channel *ch = conn_channel_get(c, channel, now_us);
		if (!ch) { /* as for a publish: handed over at its method, matched without a message id */
			struct tap_return r = {.reply_code = (uint16_t)m->args[TAP_ARG_BASIC_RETURN_REPLY_CODE].u,
			                       .reply_text = text,
			                       .exchange = x,
			                       .routing_key = rk};
			tap_track_return(tc, channel, &r, now_us);
			break;
		}
		struct pending *p = &ch->dir[TAP_S2C];
		conn_pending_reset(c, p, PENDING_RETURN);
		p->reply_code = (uint16_t)m->args[TAP_ARG_BASIC_RETURN_REPLY_CODE].u;
		p->reply_text = conn_keep(c, p, text.ptr, text.len);
		p->exchange = conn_keep(c, p, x.ptr, x.len);
		p->routing_key = conn_keep(c, p, rk.ptr, rk.len);
		break;
	}
	default:
		on_broker_consumer_method(c, channel, m, now_us);
		break;
	}
}

void conn_on_method(struct tap_conn *c, enum tap_dir dir, const struct tap_frame_ev *ev, int64_t now_us)
{
	struct tap_method m;
	int rc = tap_dialect_method_decode(ev->version, ev->data, ev->len, &m);
	if (c->capture && (dir == TAP_C2S || conn_logging_in(c)))
		conn_redact_method(c, dir, ev, &m, rc);
	if (rc != TAP_OK || !m.def) {
		conn_bad_method(c, dir, ev, rc != TAP_OK ? rc : TAP_E_UNKNOWN_METHOD, now_us);
		return; /* tracking has nothing to act on */
	}
	if (ev->channel != 0) {
		struct channel *ch = conn_channel_find(c, ev->channel);
		if (ch && ch->dir[dir].kind != PENDING_NONE)
			conn_pending_cut(c, ev->channel, &ch->dir[dir], now_us); /* a method ends any unfinished content */
		if (ch)
			ch->dir[dir].ended = false;
	}
	if (dir == TAP_C2S)
		on_client_method(c, ev->channel, &m, now_us);
	else
		on_broker_method(c, ev->channel, &m, now_us);
}
