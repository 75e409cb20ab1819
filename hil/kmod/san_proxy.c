// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * san_proxy: the SAN provider's proxy driver (pytest-san) as a Linux misc device, /dev/san_proxy.
 *
 * san_proxy.h is the contract (ioctls, mapping, errors, the sysfs "live" file); this file implements
 * it for Debian's 6.1 and 6.12 kernels on x86-64. Every object belongs to one open file and is
 * released with it, so a killed process leaves nothing behind.
 *
 * Locking: each file's mutex guards the life of its objects (look-up, checks, removal). It is never
 * held across user copies or page pinning, because mmap() takes it under the mmap lock.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/device.h>
#include <linux/dma-mapping.h>
#include <linux/fs.h>
#include <linux/gfp.h>
#include <linux/math64.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/mmzone.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/platform_device.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/sizes.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/uaccess.h>
#include <linux/version.h>
#include <linux/vmstat.h>
#include <linux/xarray.h>
#include <asm/memtype.h>
#include <asm/set_memory.h>

#include "san_proxy.h"

/* The largest buddy order (inclusive): 6.1's MAX_ORDER is exclusive, 6.4+ inclusive, 6.8+ renamed. */
#ifdef MAX_PAGE_ORDER
#define SAN_MAX_ORDER MAX_PAGE_ORDER
#elif LINUX_VERSION_CODE >= KERNEL_VERSION(6, 4, 0)
#define SAN_MAX_ORDER MAX_ORDER
#else
#define SAN_MAX_ORDER (MAX_ORDER - 1)
#endif
#define SAN_MAX_CONTIGUOUS ((u64)PAGE_SIZE << SAN_MAX_ORDER)

#define SAN_CONTIG_TRIES 8		/* blocks tried per order for a contiguous request: bounded under TCG */
#define SAN_CONTIG_SPLIT 64		/* pages: larger blocks are tried (and split) only while this small */
#define SAN_SPLIT_ORDER UINT_MAX	/* a block's order when it was cut out of a larger one: page by page */
#define SAN_PIN_CHUNK SZ_64K		/* pages per pin_user_pages_fast call */
#define SAN_FREE_MARGIN (SZ_32M >> PAGE_SHIFT)	/* pages an allocation always leaves free */
#define SAN_SYSCTL "/proc/sys/vm/lowmem_reserve_ratio"
#define SAN_RATIO_TEXT 128

/* Module-wide counts, shown in /sys/class/misc/san_proxy/live in this order. */
enum san_counter {
	SAN_FILES, SAN_PINS, SAN_PINNED_PAGES, SAN_ALLOCATIONS, SAN_ALLOCATED_PAGES,
	SAN_CONTIGUOUS, SAN_ADAPTERS, SAN_COMMON_BUFFERS, SAN_NOLOWMEM, SAN_NR_COUNTERS
};
static const char *const san_counter_names[SAN_NR_COUNTERS] = {
	"files", "pins", "pinned_pages", "allocations", "allocated_pages",
	"contiguous", "adapters", "common_buffers", "nolowmem",
};
static atomic_long_t san_live[SAN_NR_COUNTERS];

/* The devices whose DMA masks the adapters stand for. */
static struct platform_device *san_dma32, *san_dma64;

struct san_file {
	struct mutex lock;
	struct xarray objs;		/* id -> struct san_obj */
	bool nolowmem;			/* under nolow_lock */
};

struct san_obj {
	u32 kind;			/* SAN_PROXY_KIND_* */
	u32 cache;			/* SAN_PROXY_* type applied (common: cache_enabled, same values) */
	u64 length;			/* bytes asked for (adapter: maximum_length) */
	u64 base;			/* contiguous: physical base; common: logical address */
	atomic_t maps;			/* user mappings (VMAs) of it */
	unsigned long npages;		/* pages held: pages[] entries, or the block's 2^order */
	struct page **pages;		/* pin, allocation */
	struct page *first;		/* contiguous, common: first page of the memory */
	unsigned int order;		/* contiguous */
	unsigned int offset;		/* pin: the buffer's offset in its first page */
	struct mm_struct *mm;		/* pin: whose pinned_vm was charged (mmgrab'd) */
	void *cpu;			/* common: dma_alloc_coherent's address */
	struct device *dev;		/* adapter, common: the DMA device */
	struct san_obj *adapter;	/* common: its adapter */
	unsigned int buffers;		/* adapter: common buffers not freed (under the file's lock) */
};

/* ---- objects ------------------------------------------------------------------------------ */

static struct san_obj *san_obj_new(u32 kind, u64 length, u32 cache)
{
	struct san_obj *obj = kzalloc(sizeof(*obj), GFP_KERNEL);

	if (obj) {
		obj->kind = kind;
		obj->length = length;
		obj->cache = cache;
	}
	return obj;
}

/* Pages a mapping or a query of the object covers (a block's are those asked for, not its 2^order). */
static unsigned long obj_span(const struct san_obj *obj)
{
	if (obj->pages)
		return obj->npages;
	return obj->first ? PAGE_ALIGN(obj->length) >> PAGE_SHIFT : 0;
}

static struct page *obj_page(const struct san_obj *obj, unsigned long i)
{
	return obj->pages ? obj->pages[i] : nth_page(obj->first, i);
}

/* Per kind: the live counter of its objects, and of their pages (0: none). */
static const struct { u8 objects, pages; } san_kind_counters[] = {
	[SAN_PROXY_KIND_PIN] = { SAN_PINS, SAN_PINNED_PAGES },
	[SAN_PROXY_KIND_ALLOCATION] = { SAN_ALLOCATIONS, SAN_ALLOCATED_PAGES },
	[SAN_PROXY_KIND_CONTIGUOUS] = { SAN_CONTIGUOUS, 0 },
	[SAN_PROXY_KIND_ADAPTER] = { SAN_ADAPTERS, 0 },
	[SAN_PROXY_KIND_COMMON] = { SAN_COMMON_BUFFERS, 0 },
};

/* The live counts an object stands for, added (sign 1) or taken away (sign -1). */
static void obj_count(const struct san_obj *obj, long sign)
{
	const typeof(san_kind_counters[0]) *c = &san_kind_counters[obj->kind];

	atomic_long_add(sign, &san_live[c->objects]);
	if (c->pages)
		atomic_long_add(sign * (long)obj->npages, &san_live[c->pages]);
}

/* ---- cache types ---------------------------------------------------------------------------- */

/* Give the kernel's direct mapping of n pages the cache type (PAT needs it before a user mapping). */
static int kernel_cache_set(struct page *page, unsigned long n, u32 cache)
{
	unsigned long addr = (unsigned long)page_address(page);

	if (cache == SAN_PROXY_NON_CACHED)
		return set_memory_uc(addr, n);
	if (cache == SAN_PROXY_WRITE_COMBINED)
		return set_memory_wc(addr, n);
	return 0;
}

/* Back to write-back before the pages go back to the allocator; false: they must be leaked. */
static bool kernel_cache_reset(struct page *page, unsigned long n, u32 cache)
{
	int ret;

	if (cache == SAN_PROXY_CACHED)
		return true;
	ret = set_memory_wb((unsigned long)page_address(page), n);
	if (ret)
		pr_err("set_memory_wb failed (%d): %lu pages leaked\n", ret, n);
	return !ret;
}

/* A page-table entry's cache bits (4 KiB format) as a SAN_PROXY_* type. */
static u32 cache_of_bits(pteval_t bits)
{
	bits &= _PAGE_CACHE_MASK;
	if (bits == cachemode2protval(_PAGE_CACHE_MODE_WB))
		return SAN_PROXY_CACHED;
	if (bits == cachemode2protval(_PAGE_CACHE_MODE_WC))
		return SAN_PROXY_WRITE_COMBINED;
	if (bits == cachemode2protval(_PAGE_CACHE_MODE_UC_MINUS) ||
	    bits == cachemode2protval(_PAGE_CACHE_MODE_UC))
		return SAN_PROXY_NON_CACHED;
	return SAN_PROXY_CACHE_OTHER;	/* WT, WP */
}

/* The cache type of the kernel's direct mapping of a page, read from the page table. */
static u32 kernel_cache_of(struct page *page)
{
	unsigned int level;
	pte_t *pte = lookup_address((unsigned long)page_address(page), &level);
	pteval_t bits;

	if (!pte)
		return SAN_PROXY_CACHE_OTHER;
	bits = pte_val(*pte);
	if (level != PG_LEVEL_4K)	/* large pages keep PAT in bit 12 */
		bits = pgprot_val(pgprot_large_2_4k(__pgprot(bits & (_PAGE_PWT | _PAGE_PCD | _PAGE_PAT_LARGE))));
	return cache_of_bits(bits);
}

static u32 obj_kernel_cache(const struct san_obj *obj)
{
	unsigned long i, n = obj_span(obj);
	u32 type = SAN_PROXY_CACHED;

	for (i = 0; i < n; i++) {
		u32 t = kernel_cache_of(obj_page(obj, i));

		if (i && t != type)
			return SAN_PROXY_CACHE_OTHER;
		type = t;
	}
	return type;
}

/* ---- physical runs -------------------------------------------------------------------------- */

typedef int (*san_run_fn)(void *data, phys_addr_t start, u64 len);

/*
 * Call fn on each physically contiguous run of the object, in order: a pin's runs cover exactly its
 * bytes, the others' whole pages.
 */
static int obj_walk_runs(const struct san_obj *obj, san_run_fn fn, void *data)
{
	bool pin = obj->kind == SAN_PROXY_KIND_PIN;
	unsigned long i, n = obj_span(obj);
	u64 skip = pin ? obj->offset : 0;
	u64 left = pin ? obj->length : (u64)n << PAGE_SHIFT;
	phys_addr_t start = 0;
	u64 len = 0;
	int ret;

	for (i = 0; i < n && left; i++) {
		phys_addr_t p = page_to_phys(obj_page(obj, i)) + skip;
		u64 take = min_t(u64, left, PAGE_SIZE - skip);

		skip = 0;
		left -= take;
		if (len && start + len == p) {
			len += take;
			continue;
		}
		if (len) {
			ret = fn(data, start, len);
			if (ret)
				return ret;
		}
		start = p;
		len = take;
	}
	return len ? fn(data, start, len) : 0;
}

struct san_runs {
	struct san_proxy_run *out;
	u32 capacity;
	u32 count;
};

static int san_collect_run(void *data, phys_addr_t start, u64 len)
{
	struct san_runs *r = data;

	if (r->count < r->capacity) {
		r->out[r->count].address = start;
		r->out[r->count].length = len;
	}
	r->count++;
	return 0;
}

/* ---- the file's objects ----------------------------------------------------------------------- */

/* Give back what the object holds (its counts are the caller's business). */
static void obj_destroy(struct san_obj *obj)
{
	switch (obj->kind) {
	case SAN_PROXY_KIND_PIN:
		unpin_user_pages_dirty_lock(obj->pages, obj->npages, true);
		atomic64_sub(obj->npages, &obj->mm->pinned_vm);
		mmdrop(obj->mm);
		break;
	case SAN_PROXY_KIND_ALLOCATION:
		while (obj->npages)
			__free_page(obj->pages[--obj->npages]);
		break;
	case SAN_PROXY_KIND_CONTIGUOUS:
		if (!kernel_cache_reset(obj->first, obj->npages, obj->cache))
			break;
		if (obj->order != SAN_SPLIT_ORDER)
			__free_pages(obj->first, obj->order);
		else
			while (obj->npages)
				__free_page(nth_page(obj->first, --obj->npages));
		break;
	case SAN_PROXY_KIND_COMMON:
		if (kernel_cache_reset(obj->first, obj->npages, obj->cache))
			dma_free_coherent(obj->dev, obj->npages << PAGE_SHIFT, obj->cpu, obj->base);
		break;
	}
	kvfree(obj->pages);
	kfree(obj);
}

/* An object that was counted goes away. */
static void obj_drop(struct san_obj *obj)
{
	obj_count(obj, -1);
	obj_destroy(obj);
}

/* Give a new object an id in the file (counted first: a guessed id may free it at once). */
static int san_insert(struct san_file *f, struct san_obj *obj, u32 *id)
{
	int ret;

	obj_count(obj, 1);
	ret = xa_alloc(&f->objs, id, obj, XA_LIMIT(1, INT_MAX), GFP_KERNEL);
	if (ret)
		obj_drop(obj);
	return ret;
}

/* Take an object out of its file (the file's lock held). */
static void san_detach(struct san_file *f, u32 id, struct san_obj *obj)
{
	xa_erase(&f->objs, id);
	if (obj->adapter)
		obj->adapter->buffers--;
}

/* The caller never learnt the id of a new object (its answer could not be written): undo it. */
static void san_forget(struct san_file *f, u32 id)
{
	struct san_obj *obj;

	mutex_lock(&f->lock);
	obj = xa_load(&f->objs, id);
	if (obj && !atomic_read(&obj->maps) && !obj->buffers)
		san_detach(f, id, obj);
	else
		obj = NULL;	/* someone guessed the id and uses it: the file's release frees it */
	mutex_unlock(&f->lock);
	if (obj)
		obj_drop(obj);
}

/* Write a creating ioctl's answer back; if that fails the new object goes away again. */
static long san_publish(struct san_file *f, u32 id, void __user *uarg, const void *out, size_t size)
{
	if (!copy_to_user(uarg, out, size))
		return 0;
	if (id)
		san_forget(f, id);
	return -EFAULT;
}

/* A new object (NULL: none) gets its id, written into the answer (*id, inside out), which goes back. */
static long san_create(struct san_file *f, struct san_obj *obj, u32 *id, void __user *uarg,
		       const void *out, size_t size)
{
	int ret = obj ? san_insert(f, obj, id) : 0;

	return ret ? ret : san_publish(f, obj ? *id : 0, uarg, out, size);
}

/* ---- NOLOWMEM --------------------------------------------------------------------------------- */

static DEFINE_MUTEX(nolow_lock);
static unsigned int nolow_holders;
static struct file *nolow_sysctl;	/* kept open: the last holder may leave while its process exits */
static char nolow_saved[SAN_RATIO_TEXT];
static size_t nolow_saved_len;

/* Each read or write of the sysctl is a whole one, from its start. */
static ssize_t sysctl_io(struct file *file, char *buf, size_t len, bool write)
{
	loff_t pos = 0;

	return write ? kernel_write(file, buf, len, &pos) : kernel_read(file, buf, len, &pos);
}

/* The ratio text with the entries of the zones below ZONE_NORMAL set to 1. */
static int ratio_raised(const char *text, char *out, size_t size)
{
	char copy[SAN_RATIO_TEXT];
	char *cur = copy, *tok;
	int zone = 0, len = 0, val;

	strscpy(copy, text, sizeof(copy));
	while ((tok = strsep(&cur, " \t\n")) && zone < MAX_NR_ZONES) {
		if (!*tok)
			continue;
		if (kstrtoint(tok, 10, &val))
			return -EINVAL;
		if (zone < ZONE_NORMAL)
			val = 1;
		len += scnprintf(out + len, size - len, "%s%d", zone ? "\t" : "", val);
		zone++;
	}
	if (!zone)
		return -EINVAL;
	len += scnprintf(out + len, size - len, "\n");
	return len;
}

/* The first holder: save the ratio text and raise it, keeping the sysctl open. */
static int nolow_raise(void)
{
	struct file *file = filp_open(SAN_SYSCTL, O_RDWR, 0);
	char text[SAN_RATIO_TEXT];
	ssize_t n;
	int len = -EIO;

	if (IS_ERR(file))
		return PTR_ERR(file);
	n = sysctl_io(file, nolow_saved, sizeof(nolow_saved) - 1, false);
	if (n > 0) {
		nolow_saved[n] = '\0';
		nolow_saved_len = n;
		len = ratio_raised(nolow_saved, text, sizeof(text));
	}
	if (len > 0 && sysctl_io(file, text, len, true) == len) {
		nolow_sysctl = file;
		return 0;
	}
	filp_close(file, NULL);
	return len < 0 ? len : -EIO;
}

/* The last holder left: the saved text goes back. */
static void nolow_restore(void)
{
	ssize_t n = sysctl_io(nolow_sysctl, nolow_saved, nolow_saved_len, true);

	if (n != nolow_saved_len)
		pr_err("could not restore vm.lowmem_reserve_ratio (%zd)\n", n);
	filp_close(nolow_sysctl, NULL);
	nolow_sysctl = NULL;
}

static int nolow_set(struct san_file *f, bool on)
{
	int ret = 0;

	mutex_lock(&nolow_lock);
	if (on && !f->nolowmem) {
		if (!nolow_holders)
			ret = nolow_raise();
		if (!ret) {
			nolow_holders++;
			f->nolowmem = true;
		}
	} else if (!on && !f->nolowmem) {
		ret = -EINVAL;
	} else if (!on) {
		f->nolowmem = false;
		if (!--nolow_holders)
			nolow_restore();
	}
	atomic_long_set(&san_live[SAN_NOLOWMEM], nolow_holders);
	mutex_unlock(&nolow_lock);
	return ret;
}

static bool nolow_held(void)
{
	return READ_ONCE(nolow_holders) != 0;
}

/* ---- PIN ------------------------------------------------------------------------------------ */

/* Charge mm->pinned_vm as ib_umem_get does: within RLIMIT_MEMLOCK unless CAP_IPC_LOCK. */
static int pin_charge(struct mm_struct *mm, unsigned long npages)
{
	unsigned long limit = rlimit(RLIMIT_MEMLOCK) >> PAGE_SHIFT;
	unsigned long pinned = atomic64_add_return(npages, &mm->pinned_vm);

	if (pinned > limit && !capable(CAP_IPC_LOCK)) {
		atomic64_sub(npages, &mm->pinned_vm);
		return -ENOMEM;
	}
	return 0;
}

/* Pin all npages from start, or none: the error of the call that stopped. */
static int pin_pages(unsigned long start, unsigned long npages, struct page **pages)
{
	unsigned long done = 0;
	int ret = 0;

	while (done < npages) {
		int n = min_t(unsigned long, npages - done, SAN_PIN_CHUNK);

		ret = pin_user_pages_fast(start + done * PAGE_SIZE, n, FOLL_WRITE | FOLL_LONGTERM, pages + done);
		if (ret <= 0)
			break;
		done += ret;	/* each round pins at least one page: bounded */
	}
	if (done == npages)
		return 0;
	unpin_user_pages(pages, done);
	return ret == -ENOMEM ? -ENOMEM : -EFAULT;
}

static struct san_obj *pin_range(u64 address, u64 length)
{
	struct mm_struct *mm = current->mm;
	unsigned long offset = address & ~PAGE_MASK;
	unsigned long npages;
	struct san_obj *obj;
	int ret;

	if (!mm || !access_ok(u64_to_user_ptr(address), length))
		return ERR_PTR(-EFAULT);
	npages = DIV_ROUND_UP(offset + length, PAGE_SIZE);
	if (npages > totalram_pages())
		return ERR_PTR(-ENOMEM);
	obj = san_obj_new(SAN_PROXY_KIND_PIN, length, SAN_PROXY_CACHED);
	if (!obj)
		return ERR_PTR(-ENOMEM);
	obj->pages = kvmalloc_array(npages, sizeof(*obj->pages), GFP_KERNEL | __GFP_NOWARN);
	ret = obj->pages ? pin_charge(mm, npages) : -ENOMEM;
	if (!ret) {
		ret = pin_pages(address & PAGE_MASK, npages, obj->pages);
		if (ret)
			atomic64_sub(npages, &mm->pinned_vm);
	}
	if (ret) {
		kvfree(obj->pages);
		kfree(obj);
		return ERR_PTR(ret);
	}
	mmgrab(mm);
	obj->mm = mm;
	obj->npages = npages;
	obj->offset = offset;
	return obj;
}

static long san_pin(struct san_file *f, void __user *uarg)
{
	struct san_proxy_pin req;
	struct san_obj *obj;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (!req.length || req.flags)
		return -EINVAL;
	obj = pin_range(req.address, req.length);
	if (IS_ERR(obj))
		return PTR_ERR(obj);
	req.pages = obj->npages;
	return san_create(f, obj, &req.id, uarg, &req, sizeof(req));
}

/* ---- ALLOCATE ----------------------------------------------------------------------------------- */

/*
 * The proxy never drains the machine: npages more may be taken only if the zones an ordinary
 * allocation may come from (ZONE_NORMAL and above under NOLOWMEM) keep their high watermarks plus
 * a margin free.
 */
static bool san_margin_ok(unsigned long npages)
{
	unsigned long free = 0, keep = SAN_FREE_MARGIN;
	int lowest = nolow_held() ? ZONE_NORMAL : 0;
	int nid, i;

	for_each_online_node(nid) {
		for (i = lowest; i < MAX_NR_ZONES; i++) {
			struct zone *z = &NODE_DATA(nid)->node_zones[i];

			if (!populated_zone(z))
				continue;
			free += zone_page_state(z, NR_FREE_PAGES);
			keep += high_wmark_pages(z);
		}
	}
	return free >= keep && free - keep >= npages;
}

static long san_allocate(struct san_file *f, void __user *uarg)
{
	const gfp_t gfp = GFP_HIGHUSER | __GFP_ZERO | __GFP_NOWARN | __GFP_NORETRY;
	struct san_proxy_allocate req;
	struct san_obj *obj;
	unsigned long npages;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (!req.length || req.flags)
		return -EINVAL;
	if (req.length > (u64)totalram_pages() << PAGE_SHIFT)
		return -ENOMEM;
	npages = DIV_ROUND_UP_ULL(req.length, PAGE_SIZE);
	if (!san_margin_ok(npages))
		return -ENOMEM;
	obj = san_obj_new(SAN_PROXY_KIND_ALLOCATION, req.length, SAN_PROXY_CACHED);
	if (!obj)
		return -ENOMEM;
	obj->pages = kvmalloc_array(npages, sizeof(*obj->pages), GFP_KERNEL | __GFP_NOWARN);
	while (obj->pages && obj->npages < npages) {
		struct page *page = alloc_page(gfp);	/* never the OOM killer: NORETRY */

		if (!page)
			break;
		obj->pages[obj->npages++] = page;
		if (!(obj->npages % 512))
			cond_resched();
	}
	if (obj->npages < npages) {
		obj_destroy(obj);
		return -ENOMEM;
	}
	req.pages = npages;
	return san_create(f, obj, &req.id, uarg, &req, sizeof(req));
}

/* ---- ALLOCATE_CONTIGUOUS ---------------------------------------------------------------------- */

static bool contiguous_possible(const struct san_proxy_contiguous *c)
{
	return c->lowest <= c->highest && c->length - 1 <= c->highest - c->lowest &&
	       (!c->boundary || c->length <= c->boundary) && c->length <= SAN_MAX_CONTIGUOUS;
}

static bool contiguous_fits(phys_addr_t base, const struct san_proxy_contiguous *c)
{
	u64 last = base + c->length - 1;

	return base >= c->lowest && last <= c->highest &&
	       (!c->boundary || div64_u64(base, c->boundary) == div64_u64(last, c->boundary));
}

/* The zone a block below highest must come from. */
static gfp_t contiguous_zone(u64 highest)
{
	if (highest < SZ_16M)
		return GFP_KERNEL | GFP_DMA;
	if (highest < SZ_4G)
		return GFP_KERNEL | GFP_DMA32;
	return GFP_KERNEL;
}

/* The first page of [block, block + 2^order) where npages pages fit the request, or -1. */
static long block_offset(struct page *block, unsigned int order, unsigned long npages,
			 const struct san_proxy_contiguous *c)
{
	unsigned long i;

	for (i = 0; i + npages <= 1UL << order; i++)
		if (contiguous_fits(page_to_phys(block) + ((phys_addr_t)i << PAGE_SHIFT), c))
			return i;
	return -1;
}

/*
 * A buddy block holding npages pages that fit, its order and where they start in it; NULL when none came in
 * SAN_CONTIG_TRIES blocks of each order tried. The request's own order first; then, for a small request,
 * larger orders (a block just freed sits on its own order's list, and a narrow range is often inside one).
 * The misses are kept aside until the end, so that each try gets another block; then freed.
 */
static struct page *contiguous_block(const struct san_proxy_contiguous *c, unsigned long npages,
				     unsigned int *order, unsigned long *offset)
{
	gfp_t gfp = contiguous_zone(c->highest) | __GFP_ZERO | __GFP_NOWARN | __GFP_NORETRY;
	struct page *rejects[SAN_CONTIG_TRIES * 8];
	unsigned int orders[SAN_CONTIG_TRIES * 8];
	unsigned int j, n = 0, tries;
	struct page *page = NULL;
	long at = -1;

	for (j = get_order(c->length); j <= SAN_MAX_ORDER && n + SAN_CONTIG_TRIES <= ARRAY_SIZE(rejects); j++) {
		if (j > get_order(c->length) && (1UL << j) > SAN_CONTIG_SPLIT)
			break;
		for (tries = 0; tries < SAN_CONTIG_TRIES; tries++) {
			page = alloc_pages(gfp, j);
			if (!page)
				break;
			at = block_offset(page, j, npages, c);
			if (at >= 0)
				goto found;
			rejects[n] = page;
			orders[n++] = j;
		}
	}
	page = NULL;
found:
	while (n--)
		__free_pages(rejects[n], orders[n]);
	*order = j;
	*offset = at;
	return page;
}

/* The block, NULL for none, or an error. */
static struct san_obj *contiguous_alloc(const struct san_proxy_contiguous *c)
{
	unsigned long i, offset, npages = PAGE_ALIGN(c->length) >> PAGE_SHIFT;
	struct san_obj *obj;
	unsigned int order;
	struct page *page;
	int ret;

	if (!contiguous_possible(c))
		return NULL;
	obj = san_obj_new(SAN_PROXY_KIND_CONTIGUOUS, c->length, c->cache_type);
	if (!obj)
		return ERR_PTR(-ENOMEM);
	page = contiguous_block(c, npages, &order, &offset);
	if (!page) {
		kfree(obj);
		return NULL;
	}
	if (offset == 0 && order == get_order(c->length)) {
		obj->order = order;	/* the block as the buddy allocator gave it */
		obj->npages = 1UL << order;
	} else {
		/* cut out of a larger block: its pages become single pages, those outside go back */
		split_page(page, order);
		for (i = 0; i < 1UL << order; i++)
			if (i < offset || i >= offset + npages)
				__free_page(nth_page(page, i));
		page = nth_page(page, offset);
		obj->order = SAN_SPLIT_ORDER;
		obj->npages = npages;
	}
	obj->first = page;
	obj->base = page_to_phys(page);
	ret = kernel_cache_set(page, obj->npages, c->cache_type);	/* the whole block */
	if (ret) {
		obj_destroy(obj);
		return ERR_PTR(ret);
	}
	return obj;
}

static long san_allocate_contiguous(struct san_file *f, void __user *uarg)
{
	struct san_proxy_contiguous req;
	struct san_obj *obj;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (!req.length || req.cache_type > SAN_PROXY_WRITE_COMBINED || (req.boundary & ~PAGE_MASK))
		return -EINVAL;
	obj = contiguous_alloc(&req);
	if (IS_ERR(obj))
		return PTR_ERR(obj);
	req.base = obj ? obj->base : 0;
	req.id = 0;
	return san_create(f, obj, &req.id, uarg, &req, sizeof(req));
}

/* ---- GET_ADAPTER, ALLOCATE_COMMON ------------------------------------------------------------- */

static bool description_ok(const struct san_proxy_description *d)
{
	return d->version <= 3 && d->master == 1 && d->scatter_gather <= 1 && d->dma32 <= 1 &&
	       d->dma64 <= 1 && d->maximum_length && !memchr_inv(d->reserved, 0, sizeof(d->reserved));
}

static long san_get_adapter(struct san_file *f, void __user *uarg)
{
	struct san_proxy_description d;
	struct san_obj *obj;
	u64 pages;

	if (copy_from_user(&d, uarg, sizeof(d)))
		return -EFAULT;
	if (!description_ok(&d))
		return -EINVAL;
	obj = san_obj_new(SAN_PROXY_KIND_ADAPTER, d.maximum_length, SAN_PROXY_CACHED);
	if (!obj)
		return -ENOMEM;
	obj->dev = &(d.dma64 ? san_dma64 : san_dma32)->dev;
	pages = (d.maximum_length >> PAGE_SHIFT) + !!(d.maximum_length & ~PAGE_MASK);
	d.map_registers = clamp_t(u64, pages, 1, U32_MAX);
	d.dma_mask = dma_get_mask(obj->dev);
	return san_create(f, obj, &d.id, uarg, &d, sizeof(d));
}

/* A common buffer of the adapter, NULL for none, or an error. */
static struct san_obj *common_alloc(struct san_obj *adapter, u64 length, u32 cache_enabled)
{
	u32 cache = cache_enabled ? SAN_PROXY_CACHED : SAN_PROXY_NON_CACHED;
	struct san_obj *obj;
	dma_addr_t dma;
	size_t size;
	void *cpu;
	int ret;

	if (length > SAN_MAX_CONTIGUOUS)
		return NULL;
	size = PAGE_ALIGN(length);
	obj = san_obj_new(SAN_PROXY_KIND_COMMON, length, cache);
	if (!obj)
		return ERR_PTR(-ENOMEM);
	cpu = dma_alloc_coherent(adapter->dev, size, &dma, GFP_KERNEL | __GFP_NOWARN);
	if (!cpu || !virt_addr_valid(cpu)) {	/* set_memory_* and mmap need the direct map */
		if (cpu)
			dma_free_coherent(adapter->dev, size, cpu, dma);
		kfree(obj);
		return NULL;
	}
	obj->cpu = cpu;
	obj->first = virt_to_page(cpu);
	obj->npages = size >> PAGE_SHIFT;
	obj->base = dma;
	obj->dev = adapter->dev;
	obj->adapter = adapter;
	ret = kernel_cache_set(obj->first, obj->npages, cache);
	if (ret) {
		obj_destroy(obj);
		return ERR_PTR(ret);
	}
	return obj;
}

static long san_allocate_common(struct san_file *f, void __user *uarg)
{
	struct san_proxy_common req;
	struct san_obj *adapter, *obj = NULL;
	u32 id = 0;
	int ret = 0;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (!req.length || req.cache_enabled > 1 || req.reserved)
		return -EINVAL;
	mutex_lock(&f->lock);	/* the adapter must stay while a buffer is made for it */
	adapter = xa_load(&f->objs, req.adapter);
	if (!adapter || adapter->kind != SAN_PROXY_KIND_ADAPTER)
		ret = -EINVAL;
	else
		obj = common_alloc(adapter, req.length, req.cache_enabled);
	if (IS_ERR(obj))
		ret = PTR_ERR(obj);
	else if (obj)
		ret = san_insert(f, obj, &id);
	if (obj && !ret)
		adapter->buffers++;
	req.logical = obj && !ret ? obj->base : 0;
	mutex_unlock(&f->lock);
	if (ret)
		return ret;
	req.id = id;
	return san_publish(f, id, uarg, &req, sizeof(req));
}

/* ---- FREE, QUERY, INFO ------------------------------------------------------------------------ */

/* Whether a FREE names the object exactly; contiguous blocks and common buffers name their memory. */
static long free_check(const struct san_obj *obj, const struct san_proxy_free *req)
{
	bool memory = obj && (obj->kind == SAN_PROXY_KIND_CONTIGUOUS || obj->kind == SAN_PROXY_KIND_COMMON);

	if (!obj || obj->kind != req->kind || req->base != obj->base ||
	    req->length != (memory ? obj->length : 0) || req->cache != (memory ? obj->cache : 0))
		return -EINVAL;
	if (atomic_read(&obj->maps) || obj->buffers)
		return -EBUSY;
	return 0;
}

static long san_free(struct san_file *f, void __user *uarg)
{
	struct san_proxy_free req;
	struct san_obj *obj;
	long ret;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (req.reserved)
		return -EINVAL;
	mutex_lock(&f->lock);
	obj = xa_load(&f->objs, req.id);
	ret = free_check(obj, &req);
	if (!ret)
		san_detach(f, req.id, obj);
	mutex_unlock(&f->lock);
	if (!ret)
		obj_drop(obj);
	return ret;
}

static long san_query(struct san_file *f, void __user *uarg)
{
	struct san_runs runs = { NULL, 0, 0 };
	struct san_proxy_query q;
	struct san_obj *obj;
	long ret = 0;

	if (copy_from_user(&q, uarg, sizeof(q)))
		return -EFAULT;
	mutex_lock(&f->lock);
	obj = xa_load(&f->objs, q.id);
	if (!obj) {
		ret = -EINVAL;
		goto out;
	}
	runs.capacity = min_t(u64, q.capacity, obj_span(obj));	/* never more runs than pages */
	if (runs.capacity) {
		runs.out = kvmalloc_array(runs.capacity, sizeof(*runs.out), GFP_KERNEL);
		if (!runs.out) {
			ret = -ENOMEM;
			goto out;
		}
	}
	obj_walk_runs(obj, san_collect_run, &runs);
	q.kind = obj->kind;
	q.count = runs.count;
	q.length = obj->length;
	q.cache_type = obj->cache;
	q.kernel_cache = obj_kernel_cache(obj);	/* adapters, which have no memory: _CACHED */
out:
	mutex_unlock(&f->lock);
	if (!ret && runs.capacity &&
	    copy_to_user(u64_to_user_ptr(q.runs), runs.out, min(runs.capacity, runs.count) * sizeof(*runs.out)))
		ret = -EFAULT;
	if (!ret && copy_to_user(uarg, &q, sizeof(q)))
		ret = -EFAULT;
	kvfree(runs.out);
	return ret;
}

static long san_info(void __user *uarg)
{
	struct san_proxy_info info = {
		.abi = SAN_PROXY_ABI,
		.device_flags = SAN_PROXY_DO_DIRECT_IO,
		.max_contiguous = SAN_MAX_CONTIGUOUS,
		.nolowmem = nolow_held(),
		.pat = pat_enabled(),
		.page_size = PAGE_SIZE,
	};

	return copy_to_user(uarg, &info, sizeof(info)) ? -EFAULT : 0;
}

/* ---- mmap and PTES ------------------------------------------------------------------------------ */

static void san_vm_open(struct vm_area_struct *vma)
{
	struct san_obj *obj = vma->vm_private_data;

	atomic_inc(&obj->maps);
}

static void san_vm_close(struct vm_area_struct *vma)
{
	struct san_obj *obj = vma->vm_private_data;

	atomic_dec(&obj->maps);
}

static const struct vm_operations_struct san_vm_ops = {
	.open = san_vm_open,
	.close = san_vm_close,
};

struct san_remap {
	struct vm_area_struct *vma;
	unsigned long addr;
};

static int san_remap_run(void *data, phys_addr_t start, u64 len)
{
	struct san_remap *r = data;
	int ret = remap_pfn_range(r->vma, r->addr, PHYS_PFN(start), len, r->vma->vm_page_prot);

	r->addr += len;
	return ret;
}

static pgprot_t san_prot(u32 cache, pgprot_t prot)
{
	if (cache == SAN_PROXY_NON_CACHED)
		return pgprot_noncached(prot);
	if (cache == SAN_PROXY_WRITE_COMBINED)
		return pgprot_writecombine(prot);
	return prot;
}

static int san_mmap(struct file *filp, struct vm_area_struct *vma)
{
	struct san_file *f = filp->private_data;
	struct san_remap remap = { vma, vma->vm_start };
	struct san_obj *obj;
	int ret = -EINVAL;

	if (!(vma->vm_flags & VM_SHARED) || vma->vm_pgoff > INT_MAX)
		return -EINVAL;
	mutex_lock(&f->lock);
	obj = xa_load(&f->objs, vma->vm_pgoff);
	if (!obj || obj->kind == SAN_PROXY_KIND_PIN || obj->kind == SAN_PROXY_KIND_ADAPTER ||
	    vma->vm_end - vma->vm_start != obj_span(obj) << PAGE_SHIFT)
		goto out;
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
	vm_flags_set(vma, VM_DONTEXPAND | VM_DONTDUMP);
#else
	vma->vm_flags |= VM_DONTEXPAND | VM_DONTDUMP;
#endif
	vma->vm_page_prot = san_prot(obj->cache, vma->vm_page_prot);
	ret = obj_walk_runs(obj, san_remap_run, &remap);
	if (ret)
		goto out;
	vma->vm_private_data = obj;
	vma->vm_ops = &san_vm_ops;
	atomic_inc(&obj->maps);
out:
	mutex_unlock(&f->lock);
	return ret;
}

struct san_pte_walk {
	u64 *out;
	unsigned long start;
};

static int san_pte_read(pte_t *ptep, unsigned long addr, void *data)
{
	struct san_pte_walk *w = data;
	pte_t pte = ptep_get(ptep);

	if (pte_present(pte))
		w->out[(addr - w->start) >> PAGE_SHIFT] = SAN_PROXY_PTE_PRESENT |
			(u64)cache_of_bits(pte_flags(pte)) << SAN_PROXY_PTE_CACHE_SHIFT |
			(pte_pfn(pte) & SAN_PROXY_PTE_PFN_MASK);
	return 0;
}

static long san_ptes(struct file *filp, void __user *uarg)
{
	struct mm_struct *mm = current->mm;
	struct vm_area_struct *vma;
	struct san_proxy_ptes req;
	struct san_pte_walk walk;
	unsigned long size;
	long ret;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (!mm || !req.pages || req.pages > (1ULL << 20) || !PAGE_ALIGNED(req.address) ||
	    req.address > TASK_SIZE_MAX)
		return -EINVAL;
	size = req.pages << PAGE_SHIFT;
	walk.start = req.address;
	walk.out = kvcalloc(req.pages, sizeof(u64), GFP_KERNEL);
	if (!walk.out)
		return -ENOMEM;
	mmap_read_lock(mm);
	vma = vma_lookup(mm, walk.start);
	if (!vma || vma->vm_ops != &san_vm_ops || vma->vm_file != filp || size > vma->vm_end - walk.start)
		ret = -EINVAL;
	else
		ret = apply_to_existing_page_range(mm, walk.start, size, san_pte_read, &walk);
	mmap_read_unlock(mm);
	if (!ret && copy_to_user(u64_to_user_ptr(req.entries), walk.out, req.pages * sizeof(u64)))
		ret = -EFAULT;
	kvfree(walk.out);
	return ret;
}

/* ---- the device ---------------------------------------------------------------------------------- */

static long san_nolowmem(struct san_file *f, u32 __user *uarg)
{
	u32 on;

	if (get_user(on, uarg))
		return -EFAULT;
	if (on > 1)
		return -EINVAL;
	return nolow_set(f, on);
}

static long san_ioctl(struct file *filp, unsigned int cmd, unsigned long arg)
{
	struct san_file *f = filp->private_data;
	void __user *uarg = (void __user *)arg;

	switch (cmd) {
	case SAN_PROXY_INFO:
		return san_info(uarg);
	case SAN_PROXY_PIN:
		return san_pin(f, uarg);
	case SAN_PROXY_ALLOCATE:
		return san_allocate(f, uarg);
	case SAN_PROXY_ALLOCATE_CONTIGUOUS:
		return san_allocate_contiguous(f, uarg);
	case SAN_PROXY_GET_ADAPTER:
		return san_get_adapter(f, uarg);
	case SAN_PROXY_ALLOCATE_COMMON:
		return san_allocate_common(f, uarg);
	case SAN_PROXY_FREE:
		return san_free(f, uarg);
	case SAN_PROXY_QUERY:
		return san_query(f, uarg);
	case SAN_PROXY_PTES:
		return san_ptes(filp, uarg);
	case SAN_PROXY_NOLOWMEM:
		return san_nolowmem(f, uarg);
	default:
		return -ENOTTY;
	}
}

static int san_open(struct inode *inode, struct file *filp)
{
	struct san_file *f = kzalloc(sizeof(*f), GFP_KERNEL);

	if (!f)
		return -ENOMEM;
	mutex_init(&f->lock);
	xa_init_flags(&f->objs, XA_FLAGS_ALLOC1);
	filp->private_data = f;
	atomic_long_inc(&san_live[SAN_FILES]);
	return 0;
}

/* The file's last reference is gone (close, or the process's exit): release all it holds. */
static int san_release(struct inode *inode, struct file *filp)
{
	struct san_file *f = filp->private_data;
	struct san_obj *obj;
	unsigned long id;

	xa_for_each(&f->objs, id, obj) {
		xa_erase(&f->objs, id);
		obj_drop(obj);
		cond_resched();
	}
	xa_destroy(&f->objs);
	if (f->nolowmem)
		nolow_set(f, false);
	mutex_destroy(&f->lock);
	kfree(f);
	atomic_long_dec(&san_live[SAN_FILES]);
	return 0;
}

static const struct file_operations san_fops = {
	.owner = THIS_MODULE,
	.open = san_open,
	.release = san_release,
	.unlocked_ioctl = san_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = san_mmap,
	.llseek = noop_llseek,
};

static ssize_t live_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	int i, len = 0;

	for (i = 0; i < SAN_NR_COUNTERS; i++)
		len += sysfs_emit_at(buf, len, "%s %ld\n", san_counter_names[i], atomic_long_read(&san_live[i]));
	return len;
}
static DEVICE_ATTR_RO(live);

static struct attribute *san_attrs[] = {
	&dev_attr_live.attr,
	NULL,
};
ATTRIBUTE_GROUPS(san);

static struct miscdevice san_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = SAN_PROXY_NAME,
	.fops = &san_fops,
	.mode = 0600,
	.groups = san_groups,
};

static struct platform_device *san_dma_device(unsigned int bits)
{
	struct platform_device *pdev = platform_device_register_simple("san_proxy_dma", bits, NULL, 0);
	int ret;

	if (IS_ERR(pdev))
		return pdev;
	ret = dma_coerce_mask_and_coherent(&pdev->dev, DMA_BIT_MASK(bits));
	if (ret) {
		platform_device_unregister(pdev);
		return ERR_PTR(ret);
	}
	return pdev;
}

static int __init san_init(void)
{
	int ret;

	san_dma32 = san_dma_device(32);
	if (IS_ERR(san_dma32))
		return PTR_ERR(san_dma32);
	san_dma64 = san_dma_device(64);
	if (IS_ERR(san_dma64)) {
		ret = PTR_ERR(san_dma64);
		goto out32;
	}
	ret = misc_register(&san_misc);
	if (ret)
		goto out64;
	return 0;
out64:
	platform_device_unregister(san_dma64);
out32:
	platform_device_unregister(san_dma32);
	return ret;
}

static void __exit san_exit(void)
{
	misc_deregister(&san_misc);
	platform_device_unregister(san_dma64);
	platform_device_unregister(san_dma32);
}

module_init(san_init);
module_exit(san_exit);

MODULE_LICENSE("Dual MIT/GPL");
MODULE_DESCRIPTION("pytest-san: the SAN provider's proxy driver (pins, allocations, contiguous and DMA memory)");
MODULE_AUTHOR("pytest-san");
