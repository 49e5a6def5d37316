/* What the parts of metrics (metrics*.c) share, private to the core:
 *
 *   metrics.c         the fixed histogram buckets, collecting the tracker's part of a snapshot, the names of
 *                     routes, confirms, outputs and close reasons
 *   metrics_tally.c   the tally the tracker's verdict and connection hooks feed
 *   metrics_prom.c    the Prometheus text of /metrics
 *   metrics_status.c  the JSON of /api/status and /healthz
 *
 * metrics_prom.c and metrics_status.c read METRICS_SCALARS below and call metrics.c; so does metrics_tally.c;
 * metrics.c calls none of them, and none calls another. */
#ifndef AMQPTAP_METRICS_INT_H
#define AMQPTAP_METRICS_INT_H

#include "amqptap/metrics.h"

/* By enum tap_track_route, enum tap_track_confirm and enum tap_metrics_out. */
extern const char *const metrics_route_names[TAP_METRICS_N_ROUTES];
extern const char *const metrics_confirm_names[4];
extern const char *const metrics_out_names[TAP_METRICS_N_OUT];

/* ---- one-number metrics, defined once ---- */

enum metric_type { COUNTER, GAUGE, HISTOGRAM };
#define TAP_METRICS_XSTR(x) #x
#define TAP_METRICS_STR(x) TAP_METRICS_XSTR(x)

#define METRICS_SCALARS(X)                                                                                         \
	X("publishes_total", COUNTER, "basic.publish methods seen with their content.", s->track.publishes,       \
	  "publishes")                                                                                             \
	X("publish_records_total", COUNTER, "publish records written: one per publish once the broker answered.", \
	  s->track.publish_records, "publish_records")                                                             \
	X("publishes_outstanding", GAUGE, "Publishes waiting for the broker's answer (held ones included).",     \
	  s->track.outstanding, "outstanding")                                                                     \
	X("publishes_held", GAUGE, "Acked mandatory publishes held for a late Basic.Return.", s->track.held,      \
	  "held")                                                                                                  \
	X("publishes_evicted_total", COUNTER,                                                                     \
	  "Publishes written as unknown (evicted) over --max-outstanding or --max-tracking-memory.",              \
	  s->track.evicted, "evicted")                                                                             \
	X("resends_total", COUNTER, "Publishes of an identity whose previous attempt ended unknown, nacked or returned.", \
	  s->track.resends, "resends")                                                                             \
	X("duplicates_total", COUNTER, "Publishes of an identity whose previous attempt was acked or routed.",     \
	  s->track.duplicates, "duplicates")                                                                       \
	X("resend_missing_total", COUNTER, "Unknown publishes not resent within --resend-window.",                \
	  s->track.resend_missing, "resend_missing")                                                               \
	X("identities_evicted_total", COUNTER, "Identities forgotten early for the identity table's bound.",      \
	  s->track.ident_evicted + s->track.ident_evicted_unresolved, "identities_evicted")                        \
	X("confirms_stray_total", COUNTER, "Acks and nacks for a tag never published or already answered.",      \
	  s->track.stray_confirms, "stray_confirms")                                                               \
	X("returns_unmatched_total", COUNTER, "Basic.Return frames that matched no outstanding publish.",        \
	  s->track.unmatched_returns, "unmatched_returns")                                                         \
	X("tracking_short_of_memory_total", COUNTER,                                                              \
	  "Times tracking found no memory: a record lost, a verdict written early, details left out.",            \
	  s->track.oom, "tracking_short_of_memory")                                                                \
	X("connections_unfollowed_total", COUNTER,                                                                \
	  "Connections with no records: no memory to follow them, or to take them.", s->track.conns_unfollowed,   \
	  "connections_unfollowed")                                                                                \
	X("channels_unfollowed_total", COUNTER,                                                                   \
	  "Channels not followed: past the memory budget (their publishes are written unknown).",                 \
	  s->track.chans_unfollowed, "channels_unfollowed")                                                        \
	X("deliveries_total", COUNTER, "basic.deliver and get-ok with their content, sent to consumers.",      \
	  s->consume.deliveries, "deliveries")                                                                     \
	X("delivery_records_total", COUNTER, "delivery records written: one per delivery once it is settled or ended.", \
	  s->consume.delivery_records, "delivery_records")                                                         \
	X("deliveries_unacked", GAUGE, "Deliveries waiting for the consumer's ack, nack or reject.",              \
	  s->consume.unacked, "deliveries_unacked")                                                                \
	X("redeliveries_total", COUNTER, "Deliveries the broker flagged redelivered.", s->consume.redelivered,    \
	  "redeliveries")                                                                                          \
	X("requeues_total", COUNTER, "Deliveries the consumer nacked or rejected with requeue.",                 \
	  s->consume.requeued, "requeues")                                                                         \
	X("deliveries_evicted_total", COUNTER,                                                                    \
	  "Deliveries written as unknown (evicted) over the unacked bound or --max-tracking-memory.",              \
	  s->consume.evicted, "deliveries_evicted")                                                                \
	X("deliveries_unfollowed_total", COUNTER,                                                                 \
	  "Deliveries written unknown at once (no_memory): no room for their channel's state in the budget.",      \
	  s->consume.unfollowed, "deliveries_unfollowed")                                                          \
	X("consumer_settles_stray_total", COUNTER, "Consumer acks, nacks and rejects for a tag not unacked.",     \
	  s->consume.stray_settles, "consumer_settles_stray")                                                      \
	X("consumers_open", GAUGE, "Consumers started (consume-ok) and not cancelled.", s->consume.consumers_open, \
	  "consumers_open")                                                                                        \
	X("consumers_total", COUNTER, "Consumers started.", s->consume.consumers_total, "consumers_total")       \
	X("decode_errors_total", COUNTER, "Streams whose decoding stopped (decode_error records).",              \
	  s->decode_errors, "decode_errors")                                                                       \
	X("records_written_total", COUNTER, "Records handed to --verdicts (every type).",                       \
	  s->out[TAP_METRICS_OUT_VERDICTS].lines, "records_written")                                               \
	X("log_lines_lost_total", COUNTER,                                                                         \
	  "Lines of the tap's own log that stderr did not take (nobody read it, or it failed); the exit code is 1.", \
	  s->log_lines_lost, "log_lines_lost")                                                                      \
	X("connections_open", GAUGE, "Client connections open (forwarded; in sniff, followed).", s->active,      \
	  "connections_open")                                                                                      \
	X("connections_total", COUNTER, "Client connections accepted (in sniff, seen).", s->accepted,             \
	  "connections_total")                                                                                     \
	X("connections_blocked", GAUGE, "Connections the broker has blocked (connection.blocked).",              \
	  s->connections_blocked, "connections_blocked")                                                           \
	X("channels_open", GAUGE, "Channels open on the tracked connections.", s->channels_open, "channels_open")  \
	X("upstream_unreachable_total", COUNTER, "Client connections for which the broker could not be reached.", \
	  s->unreachable, "upstream_unreachable")                                                                  \
	X("upstream_address_failures_total", COUNTER,                                                              \
	  "Connects to one address of the broker's name that failed (the connection may have gone on to the next).", \
	  s->address_failures, "upstream_address_failures")                                                        \
	X("http_connections_open", GAUGE, "Connections to this metrics endpoint.", s->http_open,                  \
	  "http_connections_open")                                                                                 \
	X("http_connections_total", COUNTER, "Connections accepted by this metrics endpoint.", s->http_total,     \
	  "http_connections_total")                                                                                \
	X("http_timeouts_total", COUNTER, "Metrics endpoint connections closed for sending no complete request in time.", \
	  s->http_timeouts, "http_timeouts")                                                                       \
	X("http_accept_paused_total", COUNTER,                                                                   \
	  "Times the metrics endpoint stopped accepting at its connection cap (until the next loop turn at most).", \
	  s->http_paused, "http_accept_paused")                                                                    \
	X("http_evicted_total", COUNTER,                                                                          \
	  "Metrics endpoint connections closed at the cap to make room: the longest without a request first.",    \
	  s->http_evicted, "http_evicted")                                                                         \
	X("http_renders_total", COUNTER,                                                                          \
	  "Pages the metrics endpoint rendered; a request within a second of its page's last render gets that copy.", \
	  s->http_renders, "http_renders")                                                                         \
	X("http_paced_total", COUNTER,                                                                            \
	  "Requests the metrics endpoint made wait to stay within its rate (all clients together).",                \
	  s->http_paced, "http_paced")

#endif
