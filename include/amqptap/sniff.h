/* Live passive capture for `amqptap sniff` (src/DESIGN.md §6b): libpcap on one interface, a BPF filter for the broker
 * port, packets read from the libevent loop and pushed into a tap_replay_live. Only the io side links libpcap. */
#ifndef AMQPTAP_SNIFF_H
#define AMQPTAP_SNIFF_H

#include "amqptap/replay.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct tap_sniff;

struct tap_sniff_stats {
	uint64_t packets;  /* handed to the reassembly */
	uint64_t received; /* pcap_stats ps_recv: what the kernel put in the ring (on lo without
	                    * PACKET_IGNORE_OUTGOING, every packet twice) */
	uint64_t dropped;  /* pcap_stats ps_drop + ps_ifdrop: packets the kernel or the interface lost */
};

#define TAP_SNIFF_FILTER_MAX 1024

/* Opens and activates the capture (buffer_kib of kernel buffer, a filter for TCP on any of the n_ports ports,
 * VLAN-tagged or not) and reads it on base once the loop runs. Returns NULL with a one-line message in err and
 * *exit_code 2 when the interface does not exist, 1 otherwise (no permission: the message names CAP_NET_RAW). */
struct tap_sniff *tap_sniff_new(struct event_base *base, const char *iface, const uint16_t *ports, size_t n_ports,
				uint32_t buffer_kib, char *err, size_t cap, int *exit_code);
/* The BPF filter in use. */
const char *tap_sniff_filter(const struct tap_sniff *s);
/* The link type libpcap delivers ("EN10MB", "LINUX_SLL2", ...). */
const char *tap_sniff_link_name(const struct tap_sniff *s);
/* Where the packets go; before the loop runs. */
void tap_sniff_attach(struct tap_sniff *s, struct tap_replay_live *live);
/* Hands the packets libpcap has ready to the reassembly now. Those it does not have yet were captured at most
 * TAP_SNIFF_LAG_US ago, so once this returns the capture's clock may be moved to now - TAP_SNIFF_LAG_US
 * (tap_replay_live_advance) without settling anything before a packet that is still coming. */
void tap_sniff_read(struct tap_sniff *s);
/* How long the kernel may hold a captured packet before libpcap sees it: the ring's block timeout (5 ms), with
 * room for the kernel's timer granularity and a loop turn. */
#define TAP_SNIFF_LAG_US 50000
/* Whether the capture failed while running (the interface went away): said on stderr, the loop was ended. */
bool tap_sniff_failed(const struct tap_sniff *s);
/* Reads what libpcap still holds, then the kernel's drop counters. */
void tap_sniff_get_stats(struct tap_sniff *s, struct tap_sniff_stats *st);
void tap_sniff_free(struct tap_sniff *s);
/* "libpcap version 1.10.x ...". */
const char *tap_sniff_lib_version(void);

#endif
