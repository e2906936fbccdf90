//! Prefix caching: complete prompt pages found by the hash of their tokens and of everything
//! before them, shared between requests by reference count, evicted least recently used. Only
//! a page no other cached page follows is evicted: a lookup starts at a prompt's first page,
//! so the pages after an evicted one could no longer be found.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

use vortex_kv::{KvCache, PageId};

/// The hash of a page's tokens chained to its predecessor's hash.
pub fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

struct Entry {
    page: PageId,
    tokens: Vec<u32>,
    parent: u64,
    tick: u64,
    /// Cached pages whose parent this is.
    children: u32,
    /// Whether this page is counted in its parent's `children` (the parent was cached).
    counted: bool,
}

/// The cache holds one reference to each of its pages; a page whose only holder is the cache
/// can be evicted.
#[derive(Default)]
pub struct PrefixCache {
    entries: HashMap<u64, Entry>,
    /// The entries without children, by the tick of their last use.
    leaves: BTreeMap<u64, u64>,
    tick: u64,
}

/// What [`PrefixCache::insert`] did with a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inserted {
    /// The page is cached now.
    New,
    /// The same tokens after the same prefix are cached already, in this page: a request
    /// should hold it instead of its own copy, so that it holds every cached page before one
    /// it holds (eviction relies on it).
    Cached(PageId),
    /// Another page has this hash: nothing is cached.
    Collision,
}

/// A run of cached pages matching the start of a prompt.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Hit {
    pub pages: Vec<PageId>,
    pub hashes: Vec<u64>,
}

impl PrefixCache {
    /// Pages cached.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every cached page.
    pub fn pages(&self) -> impl Iterator<Item = PageId> + '_ {
        self.entries.values().map(|e| e.page)
    }

    /// The longest run of cached pages that starts `tokens`, at most `max_pages` long. Marks
    /// them used; the caller takes its own references.
    pub fn lookup(&mut self, tokens: &[u32], page_size: usize, max_pages: usize) -> Hit {
        let mut hit = Hit::default();
        let mut parent = 0;
        for chunk in tokens.chunks_exact(page_size).take(max_pages) {
            let h = chain_hash(parent, chunk);
            let Some(e) = self.entries.get_mut(&h) else {
                break;
            };
            if e.tokens != chunk || e.parent != parent {
                break;
            }
            self.tick += 1;
            if e.children == 0 {
                self.leaves.remove(&e.tick);
                self.leaves.insert(self.tick, h);
            }
            e.tick = self.tick;
            hit.pages.push(e.page);
            hit.hashes.push(h);
            parent = h;
        }
        hit
    }

    /// Caches `page` (holding `tokens`, after the page hashed `parent`) under `hash`, taking a
    /// reference to it, unless that hash is cached already.
    pub fn insert(
        &mut self,
        cache: &mut KvCache,
        hash: u64,
        parent: u64,
        tokens: &[u32],
        page: PageId,
    ) -> Inserted {
        if let Some(e) = self.entries.get(&hash) {
            return if e.tokens == tokens && e.parent == parent {
                Inserted::Cached(e.page)
            } else {
                Inserted::Collision
            };
        }
        cache.retain_page(page);
        self.tick += 1;
        let counted = match self.entries.get_mut(&parent) {
            Some(p) => {
                if p.children == 0 {
                    self.leaves.remove(&p.tick);
                }
                p.children += 1;
                true
            }
            None => false,
        };
        self.leaves.insert(self.tick, hash);
        self.entries.insert(
            hash,
            Entry {
                page,
                tokens: tokens.to_vec(),
                parent,
                tick: self.tick,
                children: 0,
                counted,
            },
        );
        Inserted::New
    }

    /// Pages only the cache holds: what eviction could free. (A request holds every page
    /// before one it holds, so all pages after such a page are only the cache's too.)
    pub fn evictable(&self, cache: &KvCache) -> usize {
        self.entries
            .values()
            .filter(|e| cache.allocator().refs(e.page) == 1)
            .count()
    }

    /// Frees up to `want` pages that only the cache holds, least recently used first among
    /// those no cached page follows. Returns how many went back to the free list.
    pub fn evict(&mut self, cache: &mut KvCache, want: usize) -> usize {
        let mut freed = 0;
        while freed < want {
            let victim = self
                .leaves
                .iter()
                .find(|(_, h)| cache.allocator().refs(self.entries[*h].page) == 1)
                .map(|(&t, &h)| (t, h));
            let Some((tick, hash)) = victim else {
                break;
            };
            self.leaves.remove(&tick);
            let Some(e) = self.entries.remove(&hash) else {
                break;
            };
            cache.release_page(e.page);
            freed += 1;
            if let Some(p) = self.entries.get_mut(&e.parent).filter(|_| e.counted) {
                p.children = p.children.saturating_sub(1);
                if p.children == 0 {
                    self.leaves.insert(p.tick, e.parent);
                }
            }
        }
        freed
    }

    /// Drops every entry (and the cache's references).
    pub fn clear(&mut self, cache: &mut KvCache) {
        for (_, e) in self.entries.drain() {
            cache.release_page(e.page);
        }
        self.leaves.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vortex_kv::{KvDtype, KvGeometry, Sequence};

    fn cache(pages: usize) -> KvCache {
        KvCache::new(KvGeometry::new(1, 4, 2).unwrap(), KvDtype::F32, 1, pages)
    }

    fn fill(kv: &mut KvCache, pc: &mut PrefixCache, tokens: &[u32]) -> Sequence {
        let mut seq = Sequence::default();
        kv.append(&mut seq, tokens.len()).unwrap();
        let mut parent = 0;
        for (i, chunk) in tokens.chunks_exact(2).enumerate() {
            let h = chain_hash(parent, chunk);
            pc.insert(kv, h, parent, chunk, seq.pages[i]);
            parent = h;
        }
        seq
    }

    #[test]
    fn shared_prefixes_hit_and_diverging_ones_stop() {
        let mut kv = cache(16);
        let mut pc = PrefixCache::default();
        let mut a = fill(&mut kv, &mut pc, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(pc.len(), 3);
        let hit = pc.lookup(&[1, 2, 3, 4, 9, 9, 9], 2, 10);
        assert_eq!(hit.pages, a.pages[..2].to_vec());
        // Same page contents after a different prefix must not match.
        assert!(pc.lookup(&[3, 4], 2, 10).pages.is_empty());
        assert_eq!(pc.lookup(&[1, 2, 3, 4, 5, 6], 2, 1).pages.len(), 1);
        // In use by `a`: nothing is evictable.
        assert_eq!(pc.evictable(&kv), 0);
        kv.free(&mut a);
        assert_eq!(pc.evictable(&kv), 3);
        assert_eq!(kv.allocator().used_count(), 3);
    }

    #[test]
    fn a_page_cached_twice_is_the_first_copy() {
        let mut kv = cache(16);
        let mut pc = PrefixCache::default();
        let a = fill(&mut kv, &mut pc, &[1, 2]);
        let h = chain_hash(0, &[1, 2]);
        assert_eq!(
            pc.insert(&mut kv, h, 0, &[1, 2], 9),
            Inserted::Cached(a.pages[0])
        );
        assert_eq!(pc.insert(&mut kv, h, 0, &[3, 4], 9), Inserted::Collision);
        assert_eq!(pc.len(), 1);
    }

    #[test]
    fn eviction_takes_a_chain_from_its_end() {
        let mut kv = cache(16);
        let mut pc = PrefixCache::default();
        let tokens = [1, 2, 3, 4, 5, 6, 7, 8];
        let mut a = fill(&mut kv, &mut pc, &tokens);
        kv.free(&mut a);
        pc.lookup(&tokens, 2, 4);
        assert_eq!(pc.evict(&mut kv, 1), 1);
        assert_eq!(
            pc.lookup(&tokens, 2, 4).pages.len(),
            3,
            "the first 3 still hit"
        );
        assert_eq!(pc.evict(&mut kv, 2), 2);
        assert_eq!(pc.lookup(&tokens, 2, 4).pages.len(), 1);
        assert_eq!(pc.evict(&mut kv, 5), 1);
        assert!(pc.is_empty());
        assert_eq!(kv.allocator().used_count(), 0);
        kv.allocator().check().unwrap();
    }

    #[test]
    fn eviction_frees_least_recently_used_first() {
        let mut kv = cache(16);
        let mut pc = PrefixCache::default();
        let mut a = fill(&mut kv, &mut pc, &[1, 2]);
        let mut b = fill(&mut kv, &mut pc, &[7, 8]);
        kv.free(&mut a);
        kv.free(&mut b);
        pc.lookup(&[1, 2], 2, 1);
        assert_eq!(pc.evict(&mut kv, 1), 1);
        assert_eq!(
            pc.lookup(&[1, 2], 2, 1).pages.len(),
            1,
            "recently used stays"
        );
        assert!(pc.lookup(&[7, 8], 2, 1).pages.is_empty());
        pc.clear(&mut kv);
        assert_eq!(kv.allocator().used_count(), 0);
        kv.allocator().check().unwrap();
    }
}
