/*
 * copy.c - streaming copies (copy.h).
 */
#include "common/copy.h"

#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Below this a copy stays in the cache, where the next access is cheap. */
#define STREAM_MIN 4096

void ts_copy_streaming(void *dst, const void *src, size_t n)
{
#if defined(__SSE2__)
	unsigned char *d = dst;
	const unsigned char *s = src;
	size_t head;

	if (n < STREAM_MIN) {
		memcpy(dst, src, n);
		return;
	}
	/* ordinary stores up to a 16-byte boundary of dst, which the
	 * streaming stores need */
	head = (size_t)(-(uintptr_t)d & 15);
	memcpy(d, s, head);
	d += head;
	s += head;
	n -= head;
	for (; n >= 64; n -= 64, d += 64, s += 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)(const void *)s);
		__m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));
		__m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + 48));

		_mm_stream_si128((__m128i *)(void *)d, a);
		_mm_stream_si128((__m128i *)(void *)(d + 16), b);
		_mm_stream_si128((__m128i *)(void *)(d + 32), c);
		_mm_stream_si128((__m128i *)(void *)(d + 48), e);
	}
	memcpy(d, s, n);
	_mm_sfence();
#else
	memcpy(dst, src, n);
#endif
}
