/* The wire-event layer's own declarations: what one of its files (track.c, track_return.c, track_conn.c) lends
 * another. The events themselves are the public API of amqptap/track.h; they call only the layers below. */
#ifndef AMQPTAP_TRACK_EVENT_H
#define AMQPTAP_TRACK_EVENT_H

#include "track_int.h"

/* track_conn.c: ch was just created by a publish: after tap_track_conn_unseen its mode is unknown. */
void trk_chan_first_publish(struct tap_track_conn *c, struct trk_chan *ch, int64_t now_us);

#endif
