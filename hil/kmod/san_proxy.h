/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * san_proxy: the SAN provider's proxy driver as a Linux module (pytest-san).
 *
 * The user-space interface of /dev/san_proxy, shared by the module (san_proxy.c) and the agent
 * (hil/agent/engines/verbs/proxy_module.py, which mirrors these layouts with struct/ctypes; a test
 * checks that the two agree). Every structure is made of naturally aligned __u32/__u64 fields, with
 * no implicit padding, so that its size and offsets are the same for every compiler and for Python.
 *
 * Objects. Each open file of /dev/san_proxy keeps its own objects, named by a non-zero id (__u32) that
 * is unique within the file while the object lives: pins, allocations, contiguous blocks, DMA adapters
 * and common buffers. Everything a file holds is released when the file is closed (a killed process
 * leaves nothing behind), and so is the NOLOWMEM mode it took.
 *
 * Mapping. An allocation, a contiguous block or a common buffer is mapped into the caller with
 * mmap(fd, offset = id * page size, length = its size rounded up to whole pages, PROT_READ|PROT_WRITE,
 * MAP_SHARED); the mapping's cache type is the object's. An object cannot be freed while it is mapped
 * (EBUSY): unmap it first. Pins and adapters cannot be mapped.
 *
 * Errors are negative errnos from ioctl (the agent maps them to the contract's WSA codes):
 *   EINVAL   a bad argument: unknown id, wrong kind, a size or flag out of range, values that do not
 *            match the object being freed, a reserved field that is not zero
 *   EFAULT   a user address range that is not wholly mapped (pin), or an unreadable argument
 *   ENOMEM   no memory for an ordinary allocation or a pin (the proxy never drains the machine: it
 *            refuses an allocation that would leave less than a margin free where it may come from)
 *   EBUSY    an adapter with common buffers left, an object still mapped
 *   ENOTTY   an unknown ioctl
 * A contiguous block or a common buffer that cannot be had is not an error: id 0 ("none", as P4 allows).
 */
#ifndef SAN_PROXY_H
#define SAN_PROXY_H

#ifdef __KERNEL__
#include <linux/types.h>
#include <linux/ioctl.h>
#else
#include <linux/types.h>
#include <sys/ioctl.h>
#endif

#define SAN_PROXY_NAME "san_proxy"    /* the misc device: /dev/san_proxy */
#define SAN_PROXY_ABI 1               /* bumped on any change to this file's layouts or meanings */
#define SAN_PROXY_MAGIC 0xD5

/* The device object's flags (wdm.h values): the proxy asks for direct I/O on user buffers (P1). */
#define SAN_PROXY_DO_BUFFERED_IO 0x00000004
#define SAN_PROXY_DO_DIRECT_IO   0x00000010

/* Cache types (MEMORY_CACHING_TYPE, P4), and what a page-table entry is read back as. */
#define SAN_PROXY_NON_CACHED     0    /* UC- (or UC) */
#define SAN_PROXY_CACHED         1    /* WB */
#define SAN_PROXY_WRITE_COMBINED 2    /* WC */
#define SAN_PROXY_CACHE_OTHER    3    /* read back only: WT, WP */

/* Object kinds (san_proxy_free.kind, san_proxy_query.kind). */
#define SAN_PROXY_KIND_PIN        1
#define SAN_PROXY_KIND_ALLOCATION 2
#define SAN_PROXY_KIND_CONTIGUOUS 3
#define SAN_PROXY_KIND_ADAPTER    4
#define SAN_PROXY_KIND_COMMON     5

/* SAN_PROXY_INFO: what this module is and offers. */
struct san_proxy_info {
	__u32 abi;              /* out: SAN_PROXY_ABI */
	__u32 device_flags;     /* out: the device object's flags: SAN_PROXY_DO_DIRECT_IO */
	__u64 max_contiguous;   /* out: the largest contiguous block or common buffer it hands out, bytes */
	__u32 nolowmem;         /* out: 1 while some open file holds NOLOWMEM (the reserve ratio is raised) */
	__u32 pat;              /* out: 1 when the CPU's page attribute table is on (cache types are real) */
	__u64 page_size;        /* out: PAGE_SIZE */
	__u64 reserved[4];      /* out: zero */
};

/* SAN_PROXY_PIN: DO_DIRECT_IO's buffer access. Pins the caller's own pages of [address, address +
 * length) where they are (pin_user_pages_fast with FOLL_WRITE | FOLL_LONGTERM: compaction cannot move
 * them), accounted in the caller's mm->pinned_vm (VmPin) against RLIMIT_MEMLOCK unless CAP_IPC_LOCK, as
 * ib_umem_get does. EFAULT when the range is not wholly mapped and writable. */
struct san_proxy_pin {
	__u64 address;          /* in: a user address of the caller, any alignment */
	__u64 length;           /* in: bytes, > 0 */
	__u32 flags;            /* in: 0 */
	__u32 id;               /* out */
	__u64 pages;            /* out: pages pinned */
};

/* SAN_PROXY_ALLOCATE: physical memory for messages and RDMA (P2): whole pages, zeroed, not necessarily
 * contiguous, from wherever an ordinary allocation may come from (above 4 GiB only, under NOLOWMEM). */
struct san_proxy_allocate {
	__u64 length;           /* in: bytes, > 0 */
	__u32 flags;            /* in: 0 */
	__u32 id;               /* out */
	__u64 pages;            /* out */
};

/* SAN_PROXY_ALLOCATE_CONTIGUOUS: MmAllocateContiguousMemorySpecifyCache (P3, P4). Physically
 * contiguous, page aligned, zeroed, inside [lowest, highest], crossing no multiple of boundary (0: no
 * boundary), its kernel mapping and its user mapping of cache_type. id 0 and base 0: none. */
struct san_proxy_contiguous {
	__u64 length;           /* in: bytes, > 0 */
	__u64 lowest;           /* in: lowest acceptable physical address */
	__u64 highest;          /* in: highest acceptable physical address (of the block's last byte) */
	__u64 boundary;         /* in: 0, or a multiple of the page size */
	__u32 cache_type;       /* in: SAN_PROXY_NON_CACHED, _CACHED or _WRITE_COMBINED */
	__u32 id;               /* out: 0 = none */
	__u64 base;             /* out: physical address of the first byte */
};

/* SAN_PROXY_GET_ADAPTER: IoGetDmaAdapter from a DEVICE_DESCRIPTION (P5), which the caller zeroes and
 * then fills. The adapter's common buffers come from a device whose DMA mask is 32 bits unless dma64. */
struct san_proxy_description {
	__u32 version;          /* in: 0..3 (DEVICE_DESCRIPTION_VERSION..3) */
	__u32 master;           /* in: 1: a SAN NIC is a bus master */
	__u32 scatter_gather;   /* in: 0 or 1 */
	__u32 dma32;            /* in: 0 or 1 */
	__u32 dma64;            /* in: 0 or 1 */
	__u32 interface_type;   /* in: INTERFACE_TYPE, not interpreted */
	__u64 maximum_length;   /* in: > 0 */
	__u64 reserved[4];      /* in: zero (what a zero-initialised structure has) */
	__u32 id;               /* out: the adapter */
	__u32 map_registers;    /* out: NumberOfMapRegisters: maximum_length in pages, at least 1 */
	__u64 dma_mask;         /* out: the adapter device's DMA mask */
};

/* SAN_PROXY_ALLOCATE_COMMON: the adapter's AllocateCommonBuffer (P5): dma_alloc_coherent on the
 * adapter's device; physically contiguous; the logical address is what the device sees (the guests have
 * no IOMMU: the physical address). cache_enabled 0 maps it non-cached. id 0 and logical 0: none. */
struct san_proxy_common {
	__u32 adapter;          /* in: an adapter id */
	__u32 cache_enabled;    /* in: 0 or 1 */
	__u64 length;           /* in: bytes, > 0 */
	__u32 id;               /* out: 0 = none */
	__u32 reserved;         /* in: 0 */
	__u64 logical;          /* out */
};

/* SAN_PROXY_FREE: give an object back. The caller names what it believes it frees; every value must
 * match the object or nothing happens (EINVAL):
 *   pin, allocation, adapter:  base 0, length 0, cache 0;
 *   contiguous block:          base = its physical base, length = the length asked for, cache = its type;
 *   common buffer:             base = its logical address, length as asked, cache = cache_enabled.
 * An adapter with common buffers left is EBUSY; so is an object still mapped. */
struct san_proxy_free {
	__u32 id;               /* in */
	__u32 kind;             /* in: SAN_PROXY_KIND_* */
	__u64 base;             /* in */
	__u64 length;           /* in */
	__u32 cache;            /* in */
	__u32 reserved;         /* in: 0 */
};

/* One run of physically contiguous memory. */
struct san_proxy_run {
	__u64 address;          /* physical */
	__u64 length;           /* bytes */
};

/* SAN_PROXY_QUERY: what an object really is, from the module's own page pointers: its physical runs in
 * order (a pin's cover exactly its bytes: the first starts at the buffer's offset in its page), and
 * the cache type of the kernel's own mapping of its memory (read from the page table, lookup_address). */
struct san_proxy_query {
	__u32 id;               /* in */
	__u32 capacity;         /* in: entries at runs */
	__u64 runs;             /* in: user pointer to struct san_proxy_run[capacity] (may be 0 with capacity 0) */
	__u32 kind;             /* out: SAN_PROXY_KIND_* */
	__u32 count;            /* out: runs the object has (only the first capacity are written) */
	__u64 length;           /* out: bytes asked for */
	__u32 cache_type;       /* out: the type the module applied (allocations and pins: _CACHED) */
	__u32 kernel_cache;     /* out: the kernel mapping's type read back (SAN_PROXY_CACHE_OTHER if mixed) */
};

/* SAN_PROXY_PTES: the caller's own page-table entries over pages of a mapping of this device, read
 * back: one __u64 per page, bit 63 present, bits 56-58 the cache type (SAN_PROXY_NON_CACHED ...),
 * bits 0-51 the page frame number. EINVAL unless [address, address + pages * page size) lies in one
 * mapping of this file. */
struct san_proxy_ptes {
	__u64 address;          /* in: page aligned */
	__u64 pages;            /* in: > 0, at most 1 << 20 */
	__u64 entries;          /* in: user pointer to __u64[pages] */
};
#define SAN_PROXY_PTE_PRESENT     (1ULL << 63)
#define SAN_PROXY_PTE_CACHE_SHIFT 56
#define SAN_PROXY_PTE_CACHE_MASK  (7ULL << SAN_PROXY_PTE_CACHE_SHIFT)
#define SAN_PROXY_PTE_PFN_MASK    ((1ULL << 52) - 1)

/* SAN_PROXY_NOLOWMEM: 1 takes NOLOWMEM mode, 0 leaves it. While any open file holds it, the reserve
 * ratio of every zone below ZONE_NORMAL (vm.lowmem_reserve_ratio) is 1, so that an allocation that may
 * use higher memory never falls back below 4 GiB, while GFP_DMA32 and 32-bit DMA still succeed. The
 * ratio the first holder found is written back when the last holder leaves, or its file closes. */
#define SAN_PROXY_INFO               _IOR(SAN_PROXY_MAGIC, 0, struct san_proxy_info)
#define SAN_PROXY_PIN                _IOWR(SAN_PROXY_MAGIC, 1, struct san_proxy_pin)
#define SAN_PROXY_ALLOCATE           _IOWR(SAN_PROXY_MAGIC, 2, struct san_proxy_allocate)
#define SAN_PROXY_ALLOCATE_CONTIGUOUS _IOWR(SAN_PROXY_MAGIC, 3, struct san_proxy_contiguous)
#define SAN_PROXY_GET_ADAPTER        _IOWR(SAN_PROXY_MAGIC, 4, struct san_proxy_description)
#define SAN_PROXY_ALLOCATE_COMMON    _IOWR(SAN_PROXY_MAGIC, 5, struct san_proxy_common)
#define SAN_PROXY_FREE               _IOW(SAN_PROXY_MAGIC, 6, struct san_proxy_free)
#define SAN_PROXY_QUERY              _IOWR(SAN_PROXY_MAGIC, 7, struct san_proxy_query)
#define SAN_PROXY_PTES               _IOW(SAN_PROXY_MAGIC, 8, struct san_proxy_ptes)
#define SAN_PROXY_NOLOWMEM           _IOW(SAN_PROXY_MAGIC, 9, __u32)

/*
 * /sys/class/misc/san_proxy/live: what every open file together holds now, one "name value" per line:
 *   files, pins, pinned_pages, allocations, allocated_pages, contiguous, adapters, common_buffers, nolowmem
 * (all 0 once every file is closed).
 */

#endif /* SAN_PROXY_H */
