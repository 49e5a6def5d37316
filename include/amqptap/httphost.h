/* Which Host headers the --metrics endpoint answers: a page a browser loaded from another site cannot read it by
 * pointing a DNS name of its own at the tap (DNS rebinding), because the browser then sends that name as Host. */
#ifndef AMQPTAP_HTTPHOST_H
#define AMQPTAP_HTTPHOST_H

#include <stdbool.h>

/* Whether a request whose Host header is host (NULL: none) may be answered. Allowed: no Host at all (HTTP/1.0
 * tools; browsers always send one), an IPv4 or bracketed IPv6 literal, "localhost" and names under ".localhost",
 * this_host (the machine's name, NULL: none), and the names of the comma-separated list (--metrics-host; NULL:
 * none). Names compare without case; a ":port" suffix and one trailing dot are ignored. Pure: no lookups. */
bool tap_http_host_allowed(const char *host, const char *this_host, const char *list);

#endif
