//! Moving the memtable into sled: one atomic batch per flush, with the applied LSN.

use super::*;

impl Index {
    /// Writes the memtable into sled as one atomic batch with its applied LSN. Readers keep
    /// seeing it until sled has it. Only the writer (or recovery) calls this.
    pub(crate) fn flush_memtable(&self) -> Result<()> {
        // One flush at a time, so sled receives memtables in LSN order.
        let _one = self
            .flushing_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        #[cfg(feature = "testing")]
        self.injected_flush_failure()?;
        let Some((frozen, lsn)) = self.freeze() else {
            return Ok(());
        };
        let mut counts = *self
            .stored_counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        counts.add(frozen.counts);
        let applied = self
            .batch_of(&frozen, lsn, counts)
            .and_then(|batch| self.tree.apply_batch(batch).store());
        match applied {
            Ok(()) => {
                // The stored counts change with the layer that leaves the memtable, under
                // the memtable's lock: readers never see the layer's changes twice or not at all.
                let mut mem = self.mem_mut();
                *self
                    .stored_counts
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = counts;
                mem.flushing = None;
                Ok(())
            }
            Err(e) => {
                // Keep the changes readable; the caller refuses writes and tries again later.
                self.restore(&frozen);
                Err(e)
            }
        }
    }

    /// Turns the active memtable into the flushing one (still readable) and returns it with
    /// its LSN; `None` when there is nothing to flush.
    fn freeze(&self) -> Option<(Arc<Layer>, u64)> {
        let mut mem = self.mem_mut();
        if mem.active.is_empty() {
            return None;
        }
        let frozen = Arc::new(std::mem::take(&mut mem.active));
        mem.flushing = Some(Arc::clone(&frozen));
        Some((frozen, mem.active_lsn))
    }

    /// After a failed flush: the frozen changes go back under the active ones.
    fn restore(&self, frozen: &Layer) {
        let mut mem = self.mem_mut();
        let mut restored = frozen.clone();
        restored.absorb(std::mem::take(&mut mem.active));
        mem.active = restored;
        mem.flushing = None;
    }

    /// The sled batch that moves `frozen` into sled: run starts are merged into their
    /// chunks (read from sled, changed, written once per flush), raised heads into their
    /// streams' values, other keys are copied. Only the flush (one at a time) writes sled,
    /// so the chunks and streams read here are current.
    fn batch_of(&self, frozen: &Layer, lsn: u64, counts: Counts) -> Result<sled::Batch> {
        let mut batch = sled::Batch::default();
        for (k, v) in &frozen.kv {
            if split_event_key(k).is_some() {
                return Err(chunk::chunk_error(k, "run start value is not a position"));
            }
            let head = split_stream_key(k).and_then(|id| frozen.heads.get(&id));
            match (v, head) {
                (Some(v), Some(&head)) => batch.insert(k.as_slice(), raise_head(k, v, head)?),
                (Some(v), None) => batch.insert(k.as_slice(), v.as_slice()),
                (None, _) => batch.remove(k.as_slice()),
            }
        }
        for (&id, &head) in &frozen.heads {
            let key = stream_key(id);
            if frozen.kv.contains_key(key.as_slice()) {
                continue;
            }
            // Raised in this layer over the value sled holds.
            if let Some(v) = self.tree.get(key).store()? {
                batch.insert(&key, raise_head(&key, &v, head)?);
            }
        }
        for (stream, seqs) in frozen.runs.streams() {
            let mut changes = seqs.as_slice().iter().peekable();
            while let Some(&(seq, v)) = changes.next() {
                let chunk = seq >> CHUNK_BITS;
                let key = chunk_key(stream, chunk);
                let mut entries = match self.tree.get(key).store()? {
                    Some(stored) => decode_chunk(&key, &stored)?,
                    None => ChunkEntries::new(),
                };
                merge_run_start(&mut entries, seq, v);
                // The seqs are ordered, so the chunk's other changes follow this one.
                while let Some(&(seq, v)) = changes.next_if(|(q, _)| *q >> CHUNK_BITS == chunk) {
                    merge_run_start(&mut entries, seq, v);
                }
                if entries.is_empty() {
                    batch.remove(&key);
                } else {
                    batch.insert(&key, encode_chunk(&entries));
                }
            }
        }
        batch.insert(APPLIED_LSN, &lsn.to_le_bytes());
        batch.insert(COUNTS, &counts.encode()[..]);
        batch.insert(INDEX_VERSION, &INDEX_VERSION_VALUE.to_le_bytes());
        Ok(batch)
    }
}

/// The stream value `v` (stored under `key`) with its head raised to at least `head`.
pub(super) fn raise_head(key: &[u8], v: &[u8], head: u64) -> Result<Vec<u8>> {
    let mut s: StoredStream = decode_value(key, v)?;
    s.meta.head = s.meta.head.max(head);
    Ok(encode_value(&s))
}

#[cfg(test)]
mod tests;
