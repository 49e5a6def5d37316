#include "amqptap/httphost.h"

#include <arpa/inet.h>
#include <stddef.h>
#include <string.h>
#include <strings.h>

#define HOST_MAX 255 /* a DNS name's longest textual form, with room for a trailing dot */

static bool same_name(const char *a, size_t alen, const char *b, size_t blen)
{
	if (blen > 0 && b[blen - 1] == '.')
		blen--;
	return alen == blen && alen > 0 && strncasecmp(a, b, alen) == 0;
}

static bool in_list(const char *name, size_t len, const char *list)
{
	while (list && *list) {
		const char *comma = strchr(list, ',');
		size_t n = comma ? (size_t)(comma - list) : strlen(list);
		if (same_name(name, len, list, n))
			return true;
		list = comma ? comma + 1 : NULL;
	}
	return false;
}

static bool is_ipv4(const char *name, size_t len)
{
	char text[INET_ADDRSTRLEN];
	struct in_addr a;
	if (len >= sizeof text)
		return false;
	memcpy(text, name, len);
	text[len] = '\0';
	return inet_pton(AF_INET, text, &a) == 1;
}

static bool is_ipv6_literal(const char *host, size_t len)
{
	char text[INET6_ADDRSTRLEN];
	struct in6_addr a;
	const char *end = memchr(host, ']', len);
	if (host[0] != '[' || !end || (size_t)(end - host - 1) >= sizeof text)
		return false;
	if (end + 1 < host + len && end[1] != ':') /* "[::1]" or "[::1]:port", nothing else after the bracket */
		return false;
	size_t n = (size_t)(end - host - 1);
	memcpy(text, host + 1, n);
	text[n] = '\0';
	return inet_pton(AF_INET6, text, &a) == 1;
}

bool tap_http_host_allowed(const char *host, const char *this_host, const char *list)
{
	if (!host)
		return true;
	size_t len = strnlen(host, HOST_MAX + 1);
	if (len == 0 || len > HOST_MAX)
		return false;
	if (host[0] == '[')
		return is_ipv6_literal(host, len);
	const char *colon = memchr(host, ':', len);
	size_t n = colon ? (size_t)(colon - host) : len;
	if (n > 0 && host[n - 1] == '.')
		n--;
	if (n == 0)
		return false;
	static const char localhost[] = "localhost", under[] = ".localhost";
	if (same_name(host, n, localhost, sizeof localhost - 1) ||
	    (n > sizeof under - 1 && strncasecmp(host + n - (sizeof under - 1), under, sizeof under - 1) == 0))
		return true;
	if (is_ipv4(host, n))
		return true;
	if (this_host && same_name(host, n, this_host, strlen(this_host)))
		return true;
	return in_list(host, n, list);
}
