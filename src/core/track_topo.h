/* The topology judge (track_topo.c, a consumer beside the warning rules): with --definitions, each publish is routed
 * through the routing model (route.h) as it is stored, its record gets a "topology" member, a publish that is not
 * mandatory and that the model routes nowhere is warned dropped_by_topology, and a verdict the broker's evidence
 * gives against the model's answer topology_mismatch. Without a model it costs the publish one test. */
#ifndef AMQPTAP_TRACK_TOPO_H
#define AMQPTAP_TRACK_TOPO_H

#include "track_int.h"

/* The publish p on channel id is about to be stored and t->extra holds its rendered members: appends "topology"
 * to them and sets t->topo_flags. */
void trk_topo_publish(struct tap_track_conn *c, uint16_t id, const struct trk_chan *ch, const struct tap_publish *p,
                      int64_t now_us);
/* The record of v was written with verdict vd: topology_mismatch when the broker's evidence disagrees. */
void trk_topo_verdict(struct tap_track_conn *c, uint16_t ch, const struct trk_view *v, const struct trk_verdict *vd,
                      int64_t now_us);
void trk_topo_free(struct tap_track *t);

#endif
