/* Live passive capture on libpcap (pcap(3PCAP)): pcap_create + buffer size + a short packet-buffer timeout, a BPF
 * filter for the broker ports (VLAN-tagged frames too), the selectable descriptor watched by libevent and drained
 * with non-blocking pcap_dispatch. Not immediate mode: on Linux that makes libpcap use TPACKET_V2, a ring of
 * fixed snaplen-sized slots (63 of them in 16 MiB at a 256 KiB snaplen), which a burst of small segments overruns;
 * TPACKET_V3 packs packets into its blocks, and the timeout bounds how long one waits in a block. */
#include "amqptap/sniff.h"

#include "amqptap/capture.h"
#include "amqptap/log.h"

#include <event2/event.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <pcap/pcap.h>
#include <sys/socket.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tap_sniff {
	pcap_t *p;
	struct event_base *base;
	struct event *ev;
	bool failed;
	char iface[64];
	struct tap_replay_live *live;
	uint32_t linktype;
	uint64_t packets;
	char filter[TAP_SNIFF_FILTER_MAX];
};

/* Packets wait at most this long in a block of the ring before the descriptor becomes readable. */
#define SNIFF_TIMEOUT_MS 5

/* "tcp port A or tcp port B ...", and on Ethernet the same behind a VLAN tag. Where the kernel takes the tag
 * off into packet metadata (VLAN offload: the usual case) the filter sees the untagged frame and libpcap puts
 * the tag back for the reader; the `vlan` clause is for tags that stay in the frame. Linux cooked headers
 * (`any`) carry no tag, and libpcap refuses `vlan` there. */
static bool build_filter(char *out, size_t cap, const uint16_t *ports, size_t n, int dlt)
{
	char any[TAP_SNIFF_FILTER_MAX / 2] = "";
	size_t len = 0;
	for (size_t i = 0; i < n; i++) {
		int w = snprintf(any + len, sizeof any - len, "%stcp port %u", i ? " or " : "", ports[i]);
		if (w < 0 || (size_t)w >= sizeof any - len)
			return false;
		len += (size_t)w;
	}
	int w;
	if (dlt == DLT_EN10MB)
		w = snprintf(out, cap, "(%s) or (vlan and (%s))", any, any);
	else
		w = snprintf(out, cap, "%s", any);
	return w > 0 && (size_t)w < cap;
}

/* Whether iface is a loopback interface (lo), as libpcap lists it. */
static bool is_loopback(const char *iface)
{
	char ebuf[PCAP_ERRBUF_SIZE];
	pcap_if_t *all;
	bool lo = false;
	if (pcap_findalldevs(&all, ebuf) != 0)
		return false;
	for (const pcap_if_t *d = all; d; d = d->next)
		if (strcmp(d->name, iface) == 0)
			lo = (d->flags & PCAP_IF_LOOPBACK) != 0;
	pcap_freealldevs(all);
	return lo;
}

/* A loopback interface hands a packet socket every packet twice: as it is sent and as it is received. libpcap
 * throws the sent copy away, but only after the kernel cloned it, ran the filter on it and copied it into the ring,
 * in the sender's time (the broker's or its client's). PACKET_IGNORE_OUTGOING (Linux 4.20) skips the sent copy
 * before any of that; every packet is still seen once, as it is received. Older kernels refuse the option and
 * libpcap's own dropping stays. */
static void ignore_sent_copies(pcap_t *p)
{
#ifdef PACKET_IGNORE_OUTGOING
	int one = 1;
	(void)setsockopt(pcap_fileno(p), SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one);
#else
	(void)p;
#endif
}

static void on_pcap_packet(u_char *user, const struct pcap_pkthdr *h, const u_char *bytes)
{
	struct tap_sniff *s = (struct tap_sniff *)user;
	int64_t ts = (int64_t)h->ts.tv_sec * 1000000 + h->ts.tv_usec;
	s->packets++;
	if (s->live)
		(void)tap_replay_live_packet(s->live, s->linktype, ts, bytes, h->caplen, h->len); /* no memory: counted */
}

void tap_sniff_read(struct tap_sniff *s)
{
	if (s->failed)
		return;
	int rc = pcap_dispatch(s->p, -1, on_pcap_packet, (u_char *)s); /* non-blocking: 0 when nothing is left */
	if (rc >= 0 || rc == PCAP_ERROR_BREAK)
		return;
	s->failed = true;
	tap_log_error("--interface %s: the capture failed: %s", s->iface, pcap_geterr(s->p));
	event_del(s->ev);
	if (event_base_loopexit(s->base, NULL) != 0) /* no memory for its timer: at once, which needs none */
		(void)event_base_loopbreak(s->base);
}

bool tap_sniff_failed(const struct tap_sniff *s)
{
	return s->failed;
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	tap_sniff_read(arg);
}

/* DLT_ values as libpcap returns them, to the LINKTYPE_ values the capture reader parses. */
static uint32_t linktype_of(int dlt)
{
	if (dlt == DLT_RAW)
		return TAP_CAPTURE_LINK_RAW;
	return (uint32_t)dlt;
}

struct tap_sniff *tap_sniff_new(struct event_base *base, const char *iface, const uint16_t *ports, size_t n_ports,
				uint32_t buffer_kib, char *err, size_t cap, int *exit_code)
{
	char ebuf[PCAP_ERRBUF_SIZE] = "";
	*exit_code = 1;
	struct tap_sniff *s = calloc(1, sizeof *s);
	if (!s) {
		snprintf(err, cap, "out of memory");
		return NULL;
	}
	s->base = base;
	snprintf(s->iface, sizeof s->iface, "%s", iface);
	s->p = pcap_create(iface, ebuf);
	if (!s->p) {
		snprintf(err, cap, "--interface %s: %s", iface, ebuf);
		free(s);
		return NULL;
	}
	(void)pcap_set_snaplen(s->p, 262144);      /* these only fail on an activated handle */
	(void)pcap_set_promisc(s->p, 0);
	(void)pcap_set_timeout(s->p, SNIFF_TIMEOUT_MS);
	(void)pcap_set_buffer_size(s->p, (int)(buffer_kib > 0x1FFFFF ? 0x1FFFFF : buffer_kib) * 1024);
	/* a name no interface has is the user's typo whatever the privileges: libpcap says "permission denied" first */
	int rc = strcmp(iface, "any") != 0 && if_nametoindex(iface) == 0 ? PCAP_ERROR_NO_SUCH_DEVICE : pcap_activate(s->p);
	if (rc == PCAP_ERROR_NO_SUCH_DEVICE) {
		snprintf(err, cap, "--interface %s: no such interface", iface);
		*exit_code = 2;
	} else if (rc == PCAP_ERROR_PERM_DENIED) {
		snprintf(err, cap, "--interface %s: permission denied: capturing needs CAP_NET_RAW (run as root, or "
			 "setcap cap_net_raw+ep on the binary)", iface);
	} else if (rc < 0) {
		snprintf(err, cap, "--interface %s: %s", iface, pcap_geterr(s->p));
	}
	if (rc < 0) {
		pcap_close(s->p);
		free(s);
		return NULL;
	}
	const char *filter = s->filter;
	struct bpf_program prog;
	if (!build_filter(s->filter, sizeof s->filter, ports, n_ports, pcap_datalink(s->p))) {
		snprintf(err, cap, "--port: too many ports for the capture filter");
		pcap_close(s->p);
		free(s);
		return NULL;
	}
	if (pcap_compile(s->p, &prog, filter, 1, PCAP_NETMASK_UNKNOWN) < 0 || pcap_setfilter(s->p, &prog) < 0) {
		snprintf(err, cap, "--interface %s: filter '%s': %s", iface, filter, pcap_geterr(s->p));
		pcap_close(s->p);
		free(s);
		return NULL;
	}
	pcap_freecode(&prog);
	if (is_loopback(iface))
		ignore_sent_copies(s->p);
	s->linktype = linktype_of(pcap_datalink(s->p));
	if (!tap_capture_link_known(s->linktype)) {
		const char *name = pcap_datalink_val_to_name(pcap_datalink(s->p));
		snprintf(err, cap, "--interface %s: its link type %s is not one amqptap reads (Ethernet, Linux cooked, "
			 "loopback, raw IP): capture on another interface, or on any", iface, name ? name : "?");
		*exit_code = 2;
		pcap_close(s->p);
		free(s);
		return NULL;
	}
	int fd = pcap_get_selectable_fd(s->p);
	if (fd < 0 || pcap_setnonblock(s->p, 1, ebuf) < 0) {
		snprintf(err, cap, "--interface %s: no selectable descriptor: %s", iface, ebuf);
		pcap_close(s->p);
		free(s);
		return NULL;
	}
	s->ev = event_new(base, fd, EV_READ | EV_PERSIST, on_readable, s);
	if (!s->ev || event_add(s->ev, NULL) < 0) {
		snprintf(err, cap, "--interface %s: cannot watch the capture", iface);
		tap_sniff_free(s);
		return NULL;
	}
	*exit_code = 0;
	return s;
}

void tap_sniff_attach(struct tap_sniff *s, struct tap_replay_live *live)
{
	s->live = live;
}

void tap_sniff_get_stats(struct tap_sniff *s, struct tap_sniff_stats *st)
{
	struct pcap_stat ps;
	memset(st, 0, sizeof *st);
	if (!s)
		return;
	tap_sniff_read(s); /* what is already buffered */
	st->packets = s->packets;
	if (pcap_stats(s->p, &ps) == 0) {
		st->dropped = (uint64_t)ps.ps_drop + ps.ps_ifdrop;
		st->received = ps.ps_recv;
	}
}

void tap_sniff_free(struct tap_sniff *s)
{
	if (!s)
		return;
	if (s->ev)
		event_free(s->ev);
	pcap_close(s->p);
	free(s);
}

const char *tap_sniff_filter(const struct tap_sniff *s)
{
	return s->filter;
}

const char *tap_sniff_link_name(const struct tap_sniff *s)
{
	const char *name = pcap_datalink_val_to_name(pcap_datalink(s->p));
	return name ? name : "unknown";
}

const char *tap_sniff_lib_version(void)
{
	return pcap_lib_version();
}
