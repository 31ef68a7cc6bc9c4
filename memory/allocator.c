/*
 * allocator.c - best-fit allocation with coalescing over address ranges.
 *
 * Every block (free or allocated) is a node holding [addr, addr+size) and
 * prev/next links to its address-order neighbours in the same region (NULL at
 * a region's edges, so blocks never merge across regions). A block sits in
 * exactly one of two AVL trees: free blocks in `free_tree` keyed by
 * (size, addr), so best fit is one lower-bound descent; allocated blocks in
 * `live_tree` keyed by addr, so a release finds its block in O(log n).
 * Regions sit in `region_tree` keyed by base, for the overlap test and
 * removal. Only splitting and adding a region allocate bookkeeping, and they
 * allocate before changing anything, so a failure leaves everything as it was.
 * Always: a region's first block starts at its base (a merge keeps the lower
 * block), and the counters equal what a full walk finds (ts_alloc_check).
 *
 * Test hook: ts__alloc_fail_next(a, n) makes the next n bookkeeping
 * allocations of `a` fail. It is not in the header; tests declare it.
 */
#include "memory/allocator.h"

#include <stdlib.h>

/* Intrusive AVL node; which tree it is in decides the key. */
struct avl {
	struct avl *left;
	struct avl *right;
	int height;
};

typedef int (*avl_cmp_fn)(const struct avl *x, const struct avl *y);

struct block {
	struct avl node;      /* in free_tree if is_free, else in live_tree */
	uintptr_t addr;
	uint64_t size;        /* multiple of the alignment, > 0 */
	struct block *prev;   /* lower neighbour in the same region, or NULL */
	struct block *next;   /* higher neighbour in the same region, or NULL */
	bool is_free;
};

struct region {
	struct avl node;      /* in region_tree, keyed by base */
	uintptr_t base;
	uint64_t size;
	struct block *first;  /* always starts at base */
};

struct ts_alloc {
	uint64_t alignment;   /* immutable after ts_alloc_new; a power of two */
	struct avl *free_tree;
	struct avl *live_tree;
	struct avl *region_tree;
	uint64_t bytes_in_use;
	uint64_t bytes_reserved;
	uint64_t num_live;
	uint64_t num_free;
	uint64_t num_regions;
	unsigned fail_next;   /* test hook: bookkeeping allocations left to fail */
};

#define CONTAINER_OF(p, type, member) \
	((type *)(void *)((char *)(p) - offsetof(type, member)))

static struct block *avl_block(const struct avl *n)
{
	return n ? CONTAINER_OF(n, struct block, node) : NULL;
}

static struct region *avl_region(const struct avl *n)
{
	return n ? CONTAINER_OF(n, struct region, node) : NULL;
}

/* ---- AVL tree (recursive; depth is at most ~1.44 log2 n) ---------------- */

static int avl_height(const struct avl *n)
{
	return n ? n->height : 0;
}

static void avl_update(struct avl *n)
{
	int hl = avl_height(n->left), hr = avl_height(n->right);

	n->height = (hl > hr ? hl : hr) + 1;
}

static struct avl *avl_rotate_right(struct avl *n)
{
	struct avl *l = n->left;

	n->left = l->right;
	l->right = n;
	avl_update(n);
	avl_update(l);
	return l;
}

static struct avl *avl_rotate_left(struct avl *n)
{
	struct avl *r = n->right;

	n->right = r->left;
	r->left = n;
	avl_update(n);
	avl_update(r);
	return r;
}

/* Restores the AVL balance at n, whose subtrees are balanced; new root. */
static struct avl *avl_balance(struct avl *n)
{
	int bf;

	avl_update(n);
	bf = avl_height(n->left) - avl_height(n->right);
	if (bf > 1) {
		if (avl_height(n->left->left) < avl_height(n->left->right))
			n->left = avl_rotate_left(n->left);
		return avl_rotate_right(n);
	}
	if (bf < -1) {
		if (avl_height(n->right->right) < avl_height(n->right->left))
			n->right = avl_rotate_right(n->right);
		return avl_rotate_left(n);
	}
	return n;
}

/* Inserts x (key not yet present); returns the new root. */
static struct avl *avl_insert(struct avl *root, struct avl *x, avl_cmp_fn cmp)
{
	if (!root) {
		x->left = x->right = NULL;
		x->height = 1;
		return x;
	}
	if (cmp(x, root) < 0)
		root->left = avl_insert(root->left, x, cmp);
	else
		root->right = avl_insert(root->right, x, cmp);
	return avl_balance(root);
}

static struct avl *avl_remove_min(struct avl *root, struct avl **min)
{
	if (!root->left) {
		*min = root;
		return root->right;
	}
	root->left = avl_remove_min(root->left, min);
	return avl_balance(root);
}

/* Removes x, which is in the tree (keys are unique); returns the new root. */
static struct avl *avl_remove(struct avl *root, struct avl *x, avl_cmp_fn cmp)
{
	struct avl *l, *r, *m;
	int c;

	if (!root)
		return NULL;
	c = cmp(x, root);
	if (c < 0) {
		root->left = avl_remove(root->left, x, cmp);
	} else if (c > 0) {
		root->right = avl_remove(root->right, x, cmp);
	} else {
		l = root->left;
		r = root->right;
		if (!r)
			return l;
		r = avl_remove_min(r, &m);
		m->left = l;
		m->right = r;
		return avl_balance(m);
	}
	return avl_balance(root);
}

static int cmp_u64(uint64_t x, uint64_t y)
{
	return (x > y) - (x < y);
}

static int cmp_free(const struct avl *x, const struct avl *y)
{
	const struct block *bx = avl_block(x), *by = avl_block(y);
	int c = cmp_u64(bx->size, by->size);

	return c ? c : cmp_u64(bx->addr, by->addr);
}

static int cmp_live(const struct avl *x, const struct avl *y)
{
	return cmp_u64(avl_block(x)->addr, avl_block(y)->addr);
}

static int cmp_region(const struct avl *x, const struct avl *y)
{
	return cmp_u64(avl_region(x)->base, avl_region(y)->base);
}

/* ---- lookups ------------------------------------------------------------- */

/* Smallest free block with size >= size, lowest address among equals. */
static struct block *free_lower_bound(const struct ts_alloc *a, uint64_t size)
{
	struct avl *n = a->free_tree, *best = NULL;

	while (n) {
		if (avl_block(n)->size >= size) {
			best = n;
			n = n->left;
		} else {
			n = n->right;
		}
	}
	return avl_block(best);
}

static struct block *live_find(const struct ts_alloc *a, uintptr_t addr)
{
	struct avl *n = a->live_tree;

	while (n) {
		struct block *b = avl_block(n);

		if (addr == b->addr)
			return b;
		n = addr < b->addr ? n->left : n->right;
	}
	return NULL;
}

/* Region with the greatest base <= addr, or NULL. */
static struct region *region_floor(const struct ts_alloc *a, uintptr_t addr)
{
	struct avl *n = a->region_tree, *best = NULL;

	while (n) {
		if (avl_region(n)->base <= addr) {
			best = n;
			n = n->right;
		} else {
			n = n->left;
		}
	}
	return avl_region(best);
}

/* Region with the smallest base > addr, or NULL. */
static struct region *region_above(const struct ts_alloc *a, uintptr_t addr)
{
	struct avl *n = a->region_tree, *best = NULL;

	while (n) {
		if (avl_region(n)->base > addr) {
			best = n;
			n = n->left;
		} else {
			n = n->right;
		}
	}
	return avl_region(best);
}

/* ---- bookkeeping memory -------------------------------------------------- */

static void *bk_alloc(struct ts_alloc *a, size_t size)
{
	if (a->fail_next > 0) {
		a->fail_next--;
		return NULL;
	}
	return malloc(size);
}

/*
 * Test hook: the next n bookkeeping allocations of a fail as if out of
 * memory (n = 0 disarms). Not thread-safe; internal, declared by tests only.
 */
void ts__alloc_fail_next(struct ts_alloc *a, unsigned n);

void ts__alloc_fail_next(struct ts_alloc *a, unsigned n)
{
	a->fail_next = n;
}

/* ---- public API ---------------------------------------------------------- */

struct ts_alloc *ts_alloc_new(uint64_t alignment)
{
	struct ts_alloc *a;

	if (alignment == 0 || (alignment & (alignment - 1)) != 0)
		return NULL;
	a = calloc(1, sizeof(*a));
	if (!a)
		return NULL;
	a->alignment = alignment;
	return a;
}

static void free_region_tree(struct avl *n)
{
	struct region *r;
	struct block *b, *next;

	if (!n)
		return;
	free_region_tree(n->left);
	free_region_tree(n->right);
	r = avl_region(n);
	for (b = r->first; b; b = next) {
		next = b->next;
		free(b);
	}
	free(r);
}

void ts_alloc_free(struct ts_alloc *a)
{
	if (!a)
		return;
	free_region_tree(a->region_tree);
	free(a);
}

uint64_t ts_alloc_round(const struct ts_alloc *a, uint64_t size)
{
	uint64_t mask = a->alignment - 1;

	if (size > UINT64_MAX - mask)
		return 0;
	return (size + mask) & ~mask;
}

static bool region_args_ok(const struct ts_alloc *a, uintptr_t base,
			   uint64_t size)
{
	uint64_t mask = a->alignment - 1;
	const struct region *below, *above;

	if (size == 0 || (base & mask) != 0 || (size & mask) != 0)
		return false;
	/* The end must be representable: every block end is then, too. */
	if (size > (uint64_t)UINTPTR_MAX - base)
		return false;
	below = region_floor(a, base);
	if (below && (uint64_t)below->base + below->size > base)
		return false;
	above = region_above(a, base);
	if (above && (uint64_t)base + size > above->base)
		return false;
	return true;
}

bool ts_alloc_add_region(struct ts_alloc *a, uintptr_t base, uint64_t size)
{
	struct region *r = NULL;
	struct block *b;

	if (!region_args_ok(a, base, size))
		goto out_fail;
	r = bk_alloc(a, sizeof(*r));
	if (!r)
		goto out_fail;
	b = bk_alloc(a, sizeof(*b));
	if (!b)
		goto out_free_region;

	b->addr = base;
	b->size = size;
	b->prev = b->next = NULL;
	b->is_free = true;
	r->base = base;
	r->size = size;
	r->first = b;
	a->region_tree = avl_insert(a->region_tree, &r->node, cmp_region);
	a->free_tree = avl_insert(a->free_tree, &b->node, cmp_free);
	a->bytes_reserved += size;
	a->num_free++;
	a->num_regions++;
	return true;

out_free_region:
	free(r);
out_fail:
	return false;
}

bool ts_alloc_remove_region(struct ts_alloc *a, uintptr_t base)
{
	struct region *r = region_floor(a, base);
	struct block *b;

	if (!r || r->base != base)
		return false;
	b = r->first;
	if (!b->is_free || b->next)
		return false;

	a->free_tree = avl_remove(a->free_tree, &b->node, cmp_free);
	a->region_tree = avl_remove(a->region_tree, &r->node, cmp_region);
	a->bytes_reserved -= r->size;
	a->num_free--;
	a->num_regions--;
	free(b);
	free(r);
	return true;
}

bool ts_alloc_alloc(struct ts_alloc *a, uint64_t size, uintptr_t *addr)
{
	uint64_t need = ts_alloc_round(a, size);
	struct block *b, *rest = NULL;

	if (need == 0)
		return false;
	b = free_lower_bound(a, need);
	if (!b)
		return false;
	if (b->size > need) {
		rest = bk_alloc(a, sizeof(*rest));
		if (!rest)
			return false;
	}

	a->free_tree = avl_remove(a->free_tree, &b->node, cmp_free);
	a->num_free--;
	if (rest) {
		/* b keeps the low part, so a region's first block never moves. */
		rest->addr = b->addr + need;
		rest->size = b->size - need;
		rest->is_free = true;
		rest->prev = b;
		rest->next = b->next;
		if (b->next)
			b->next->prev = rest;
		b->next = rest;
		b->size = need;
		a->free_tree = avl_insert(a->free_tree, &rest->node, cmp_free);
		a->num_free++;
	}
	b->is_free = false;
	a->live_tree = avl_insert(a->live_tree, &b->node, cmp_live);
	a->bytes_in_use += need;
	a->num_live++;
	*addr = b->addr;
	return true;
}

/* Folds hi (the free block right after lo) into lo and frees hi. */
static void absorb_next(struct ts_alloc *a, struct block *lo, struct block *hi)
{
	a->free_tree = avl_remove(a->free_tree, &hi->node, cmp_free);
	a->num_free--;
	lo->size += hi->size;
	lo->next = hi->next;
	if (hi->next)
		hi->next->prev = lo;
	free(hi);
}

bool ts_alloc_release(struct ts_alloc *a, uintptr_t addr)
{
	struct block *b = live_find(a, addr);

	if (!b)
		return false;
	a->live_tree = avl_remove(a->live_tree, &b->node, cmp_live);
	a->bytes_in_use -= b->size;
	a->num_live--;
	b->is_free = true;
	if (b->next && b->next->is_free)
		absorb_next(a, b, b->next);
	if (b->prev && b->prev->is_free) {
		struct block *lo = b->prev;

		/* lo leaves the free tree: its key (size) is about to change. */
		a->free_tree = avl_remove(a->free_tree, &lo->node, cmp_free);
		lo->size += b->size;
		lo->next = b->next;
		if (b->next)
			b->next->prev = lo;
		free(b);
		b = lo;
		a->num_free--;
	}
	a->free_tree = avl_insert(a->free_tree, &b->node, cmp_free);
	a->num_free++;
	return true;
}

bool ts_alloc_region_of(const struct ts_alloc *a, uintptr_t addr, uintptr_t *base,
                        uint64_t *size, bool *idle)
{
	const struct region *r = region_floor(a, addr);

	if (!r || addr - r->base >= r->size)
		return false;
	*base = r->base;
	*size = r->size;
	*idle = r->first->is_free && !r->first->next;
	return true;
}

uint64_t ts_alloc_block_size(const struct ts_alloc *a, uintptr_t addr)
{
	const struct block *b = live_find(a, addr);

	return b ? b->size : 0;
}

static uint64_t largest_free(const struct ts_alloc *a)
{
	const struct avl *n = a->free_tree;

	if (!n)
		return 0;
	while (n->right)
		n = n->right;
	return avl_block(n)->size;
}

void ts_alloc_get_stats(const struct ts_alloc *a, struct ts_alloc_stats *out)
{
	out->bytes_in_use = a->bytes_in_use;
	out->bytes_reserved = a->bytes_reserved;
	out->bytes_free = a->bytes_reserved - a->bytes_in_use;
	out->largest_free_block = largest_free(a);
	out->num_live_allocs = a->num_live;
	out->num_free_blocks = a->num_free;
	out->num_regions = a->num_regions;
}

/* ---- invariant check ----------------------------------------------------- */

/*
 * Checks heights, balance and strict key order of the subtree at n, and
 * that its nodes are blocks of the given state (want_free) when blocks is
 * set. Counts nodes into *count; *lo is the previous node in order.
 */
static bool avl_valid(const struct avl *n, avl_cmp_fn cmp, const struct avl **lo,
		      uint64_t *count, bool blocks, bool want_free)
{
	int hl, hr;

	if (!n)
		return true;
	if (!avl_valid(n->left, cmp, lo, count, blocks, want_free))
		return false;
	if (*lo && cmp(*lo, n) >= 0)
		return false;
	if (blocks && avl_block(n)->is_free != want_free)
		return false;
	*lo = n;
	(*count)++;
	if (!avl_valid(n->right, cmp, lo, count, blocks, want_free))
		return false;
	hl = avl_height(n->left);
	hr = avl_height(n->right);
	if (n->height != (hl > hr ? hl : hr) + 1 || hl - hr > 1 || hr - hl > 1)
		return false;
	return true;
}

/* Whether x itself (not merely an equal key) is in the tree at root. */
static bool avl_contains(const struct avl *root, const struct avl *x,
			 avl_cmp_fn cmp)
{
	while (root) {
		int c = cmp(x, root);

		if (c == 0)
			return root == x;
		root = c < 0 ? root->left : root->right;
	}
	return false;
}

struct walk {
	uint64_t in_use, free_bytes, reserved, live, nfree, regions, largest;
};

static bool region_valid(const struct ts_alloc *a, const struct region *r,
			 struct walk *w)
{
	uint64_t mask = a->alignment - 1;
	uint64_t at = r->base;
	const struct block *b, *prev = NULL;

	if (r->size == 0 || (r->base & mask) || (r->size & mask) || !r->first)
		return false;
	for (b = r->first; b; prev = b, b = b->next) {
		if (b->prev != prev || b->addr != at || b->size == 0 ||
		    (b->size & mask) || b->size > r->base + r->size - at)
			return false;
		if (b->is_free && prev && prev->is_free)
			return false;
		if (!avl_contains(b->is_free ? a->free_tree : a->live_tree,
				  &b->node, b->is_free ? cmp_free : cmp_live))
			return false;
		if (b->is_free) {
			w->nfree++;
			w->free_bytes += b->size;
			if (b->size > w->largest)
				w->largest = b->size;
		} else {
			w->live++;
			w->in_use += b->size;
		}
		at += b->size;
	}
	if (at != (uint64_t)r->base + r->size)
		return false;
	w->reserved += r->size;
	w->regions++;
	return true;
}

/* Walks regions in base order; each must end at or before the next one. */
static bool regions_valid(const struct ts_alloc *a, const struct avl *n,
			  uint64_t *end, bool *seen, struct walk *w)
{
	const struct region *r;

	if (!n)
		return true;
	if (!regions_valid(a, n->left, end, seen, w))
		return false;
	r = avl_region(n);
	if (*seen && r->base < *end)
		return false;
	if (!region_valid(a, r, w))
		return false;
	*end = (uint64_t)r->base + r->size;
	*seen = true;
	return regions_valid(a, n->right, end, seen, w);
}

/*
 * The walk is linear; finding each walked block in its tree (to prove the
 * trees hold exactly the walked blocks) adds a log factor: O(n log n).
 */
bool ts_alloc_check(const struct ts_alloc *a)
{
	struct walk w = {0};
	struct ts_alloc_stats st;
	const struct avl *lo;
	uint64_t nfree_tree = 0, nlive_tree = 0, nregion_tree = 0, end = 0;
	bool seen = false;

	if (!a || a->alignment == 0 || (a->alignment & (a->alignment - 1)))
		return false;
	lo = NULL;
	if (!avl_valid(a->free_tree, cmp_free, &lo, &nfree_tree, true, true))
		return false;
	lo = NULL;
	if (!avl_valid(a->live_tree, cmp_live, &lo, &nlive_tree, true, false))
		return false;
	lo = NULL;
	if (!avl_valid(a->region_tree, cmp_region, &lo, &nregion_tree, false, false))
		return false;
	if (!regions_valid(a, a->region_tree, &end, &seen, &w))
		return false;

	/* Every block walked was found in its tree; equal counts make the
	 * trees hold nothing else. */
	if (nfree_tree != w.nfree || nlive_tree != w.live ||
	    nregion_tree != w.regions)
		return false;
	ts_alloc_get_stats(a, &st);
	return st.bytes_in_use == w.in_use && st.bytes_reserved == w.reserved &&
	       st.bytes_free == w.free_bytes && st.largest_free_block == w.largest &&
	       st.num_live_allocs == w.live && st.num_free_blocks == w.nfree &&
	       st.num_regions == w.regions;
}
