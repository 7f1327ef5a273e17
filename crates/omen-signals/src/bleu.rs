//! Sentence BLEU-4 equal to sacreBLEU's `sentence_bleu` (13a tokenisation, exp
//! smoothing, effective order), in a batch form and a streaming form that
//! takes text deltas as a model emits them and always equals the batch result.

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};

use crate::SignalError;

/// Highest n-gram order of BLEU-4.
pub const MAX_ORDER: usize = 4;

/// Whitespace as Python's `str.split()` sees it: Rust's definition plus U+001C..U+001F.
pub fn is_python_whitespace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Characters that any 13a rule can split on; a word without them is one token.
fn needs_rules(c: char) -> bool {
    matches!(c, '\u{20}'..='\u{26}' | '\u{28}'..='\u{2f}' | '\u{3a}'..='\u{40}' | '\u{5b}'..='\u{60}' | '\u{7b}'..='\u{7e}')
}

/// Rule 1's class `[\x7B-\x7E\x5B-\x60\x20-\x26\x28-\x2B\x3A-\x40\x2F]`: punctuation and symbols.
fn is_symbol(c: char) -> bool {
    matches!(c, '\u{7b}'..='\u{7e}' | '\u{5b}'..='\u{60}' | '\u{20}'..='\u{26}' | '\u{28}'..='\u{2b}' | '\u{3a}'..='\u{40}' | '/')
}

/// `[\.,]`
fn is_period_or_comma(c: char) -> bool {
    c == '.' || c == ','
}

/// `[0-9]` (ASCII digits only, as in the regex).
fn is_digit(c: char) -> bool {
    c.is_ascii_digit()
}

/// Rewrites every non-overlapping, leftmost pair (a, b) with `matches(a, b)`, as a regex
/// `(A)(B)` replace_all does: after a match, the search resumes after its second character.
fn rewrite_pairs(
    input: &str,
    out: &mut String,
    matches: fn(char, char) -> bool,
    emit: fn(char, char, &mut String),
) {
    out.clear();
    let mut chars = input.chars().peekable();
    while let Some(a) = chars.next() {
        if let Some(&b) = chars.peek() {
            if matches(a, b) {
                chars.next();
                emit(a, b, out);
                continue;
            }
        }
        out.push(a);
    }
}

/// The 13a tokeniser (mteval-v13a as sacreBLEU implements it).
///
/// The four regex rules are applied by hand-written character passes with the
/// same leftmost, non-overlapping semantics (the tests check them against the
/// regexes); this avoids the regex engine and its allocations per word.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tokenizer13a {
    _private: (),
}

/// Reusable buffers for [`Tokenizer13a::apply_rules`], so that a stream allocates nothing per word.
#[derive(Debug, Clone, Default)]
struct RuleBuffers {
    a: String,
    b: String,
}

impl Tokenizer13a {
    /// The 13a tokeniser (it has no state; this exists for API symmetry).
    pub fn new() -> Self {
        Self::default()
    }

    /// The four 13a rules over `text` padded with a space each side (as sacreBLEU
    /// pads the line); the result is left in `buffers.a`.
    fn apply_rules(&self, text: &str, buffers: &mut RuleBuffers) {
        let RuleBuffers { a, b } = buffers;
        // 1: punctuation and symbols become tokens of their own
        a.clear();
        for c in std::iter::once(' ').chain(text.chars()).chain(std::iter::once(' ')) {
            if is_symbol(c) {
                a.extend([' ', c, ' ']);
            } else {
                a.push(c);
            }
        }
        // 2: period and comma unless preceded by a digit: ([^0-9])([\.,]) -> "$1 $2 "
        rewrite_pairs(
            a,
            b,
            |x, y| !is_digit(x) && is_period_or_comma(y),
            |x, y, out| out.extend([x, ' ', y, ' ']),
        );
        // 3: period and comma unless followed by a digit: ([\.,])([^0-9]) -> " $1 $2"
        rewrite_pairs(
            b,
            a,
            |x, y| is_period_or_comma(x) && !is_digit(y),
            |x, y, out| out.extend([' ', x, ' ', y]),
        );
        // 4: dash when preceded by a digit: ([0-9])(-) -> "$1 $2 "
        rewrite_pairs(a, b, |x, y| is_digit(x) && y == '-', |x, y, out| out.extend([x, ' ', y, ' ']));
        std::mem::swap(a, b);
    }

    /// Tokens of a segment exactly as sacreBLEU's BLEU preprocesses it (rstrip, then 13a).
    pub fn tokenize(&self, text: &str) -> Vec<String> {
        let line = text.trim_end_matches(is_python_whitespace);
        let mut line = line.replace("<skipped>", "").replace("-\n", "").replace('\n', " ");
        if line.contains('&') {
            line =
                line.replace("&quot;", "\"").replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">");
        }
        let mut buffers = RuleBuffers::default();
        self.apply_rules(&line, &mut buffers);
        buffers.a.split(is_python_whitespace).filter(|t| !t.is_empty()).map(str::to_owned).collect()
    }

    /// Passes the tokens of one whitespace-free word (after the line-level replacements) to `on_token`.
    ///
    /// The 13a rules look one character to each side and whitespace is neither a
    /// digit nor `.`/`,`, so a line's tokens are the concatenation of its words'.
    fn word_tokens(&self, word: &str, buffers: &mut RuleBuffers, on_token: &mut impl FnMut(&str)) {
        if !word.chars().any(needs_rules) {
            on_token(word);
            return;
        }
        self.apply_rules(word, buffers);
        for token in buffers.a.split(is_python_whitespace).filter(|t| !t.is_empty()) {
            on_token(token);
        }
    }
}

/// 13a tokens of `text`.
pub fn tokenize_13a(text: &str) -> Vec<String> {
    Tokenizer13a::new().tokenize(text)
}

/// Sufficient statistics of sentence BLEU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BleuStats {
    /// Hypothesis length in tokens.
    pub sys_len: usize,
    /// Length of the closest reference.
    pub ref_len: usize,
    /// Clipped n-gram matches per order.
    pub correct: [u64; MAX_ORDER],
    /// Hypothesis n-grams per order.
    pub total: [u64; MAX_ORDER],
}

/// A sentence BLEU result on sacreBLEU's scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BleuScore {
    /// BLEU in [0, 100], as sacreBLEU reports it.
    pub score: f64,
    /// n-gram precisions in percent (smoothed).
    pub precisions: [f64; MAX_ORDER],
    /// Brevity penalty.
    pub brevity_penalty: f64,
    /// The statistics the score came from.
    pub stats: BleuStats,
}

impl BleuScore {
    /// BLEU as a fraction in [0, 1] (clamped: a perfect match computes as 100.00000000000004).
    pub fn fraction(&self) -> f64 {
        (self.score / 100.0).clamp(0.0, 1.0)
    }
}

impl BleuStats {
    /// BLEU with exp smoothing and effective order, as sacreBLEU's `compute_bleu`.
    pub fn score(&self) -> BleuScore {
        let (sys_len, ref_len) = (self.sys_len as f64, self.ref_len as f64);
        let brevity_penalty = if self.sys_len < self.ref_len {
            if self.sys_len > 0 {
                (1.0 - ref_len / sys_len).exp()
            } else {
                0.0
            }
        } else {
            1.0
        };
        let mut precisions = [0.0; MAX_ORDER];
        if self.correct.iter().all(|&c| c == 0) {
            return BleuScore { score: 0.0, precisions, brevity_penalty, stats: *self };
        }
        let mut smooth = 1.0;
        let mut effective_order = MAX_ORDER;
        for (n, precision) in precisions.iter_mut().enumerate() {
            if self.total[n] == 0 {
                break;
            }
            effective_order = n + 1;
            *precision = if self.correct[n] == 0 {
                smooth *= 2.0;
                100.0 / (smooth * self.total[n] as f64)
            } else {
                100.0 * self.correct[n] as f64 / self.total[n] as f64
            };
        }
        // sacreBLEU floors log(0) to -9999999999.
        let log_sum: f64 = precisions[..effective_order]
            .iter()
            .map(|&p| if p == 0.0 { -9_999_999_999.0 } else { p.ln() })
            .sum();
        let score = brevity_penalty * (log_sum / effective_order as f64).exp();
        BleuScore { score, precisions, brevity_penalty, stats: *self }
    }
}

/// An n-gram of token ids; unused trailing slots are `u32::MAX`.
type NgramKey = [u32; MAX_ORDER];

fn ngram_key(ids: &[u32]) -> NgramKey {
    let mut key = [u32::MAX; MAX_ORDER];
    key[..ids.len()].copy_from_slice(ids);
    key
}

/// A reference n-gram: its clip count and the slot that holds the hypothesis' count of it.
#[derive(Debug, Clone, Copy)]
struct RefNgram {
    max_count: u32,
    slot: u32,
}

/// Reference side of BLEU, prepared once per canary: token ids, max n-gram counts, lengths.
#[derive(Debug, Clone)]
pub struct BleuReference {
    tokenizer: Tokenizer13a,
    vocab: HashMap<String, u32>,
    ngrams: HashMap<NgramKey, RefNgram>,
    lengths: Vec<usize>,
}

impl BleuReference {
    /// Prepares one or more reference answers.
    pub fn new<S: AsRef<str>>(references: &[S]) -> Result<Self, SignalError> {
        Self::with_tokenizer(references, Tokenizer13a::new())
    }

    /// As [`BleuReference::new`], with a given tokeniser.
    pub fn with_tokenizer<S: AsRef<str>>(
        references: &[S],
        tokenizer: Tokenizer13a,
    ) -> Result<Self, SignalError> {
        if references.is_empty() {
            return Err(SignalError::Empty { input: "references", needed: 1 });
        }
        let mut vocab: HashMap<String, u32> = HashMap::new();
        let mut max_counts: HashMap<NgramKey, u32> = HashMap::new();
        let mut lengths = Vec::with_capacity(references.len());
        for reference in references {
            let tokens = tokenizer.tokenize(reference.as_ref());
            lengths.push(tokens.len());
            let ids: Vec<u32> = tokens
                .into_iter()
                .map(|t| {
                    let next = vocab.len() as u32;
                    *vocab.entry(t).or_insert(next)
                })
                .collect();
            let mut counts: HashMap<NgramKey, u32> = HashMap::new();
            for n in 1..=MAX_ORDER {
                for window in ids.windows(n) {
                    *counts.entry(ngram_key(window)).or_insert(0) += 1;
                }
            }
            for (key, count) in counts {
                let slot = max_counts.entry(key).or_insert(0);
                *slot = (*slot).max(count);
            }
        }
        let ngrams = max_counts
            .into_iter()
            .enumerate()
            .map(|(slot, (key, max_count))| (key, RefNgram { max_count, slot: slot as u32 }))
            .collect();
        Ok(Self { tokenizer, vocab, ngrams, lengths })
    }

    /// The tokeniser the reference was prepared with.
    pub fn tokenizer(&self) -> &Tokenizer13a {
        &self.tokenizer
    }

    /// Length of the reference closest to `hyp_len` (ties go to the shorter), as sacreBLEU.
    pub fn closest_length(&self, hyp_len: usize) -> usize {
        let mut best: Option<(usize, usize)> = None;
        for &len in &self.lengths {
            let diff = hyp_len.abs_diff(len);
            best = match best {
                None => Some((diff, len)),
                Some((d, l)) if diff < d || (diff == d && len < l) => Some((diff, len)),
                keep => keep,
            };
        }
        best.map(|(_, len)| len).unwrap_or(0)
    }

    /// Statistics of a tokenised hypothesis against this reference.
    pub fn stats_for_tokens(&self, tokens: &[String]) -> BleuStats {
        let mut state = HypothesisState::new(self);
        for token in tokens {
            state.push(self, token);
        }
        state.stats(self)
    }

    /// Number of distinct tokens in the references; ids below it are reference tokens.
    fn vocab_len(&self) -> u32 {
        self.vocab.len() as u32
    }
}

/// Sentence BLEU of `hypothesis` against `references`, equal to sacreBLEU's `sentence_bleu`.
pub fn sentence_bleu<S: AsRef<str>>(hypothesis: &str, references: &[S]) -> Result<BleuScore, SignalError> {
    let reference = BleuReference::new(references)?;
    let tokens = reference.tokenizer.tokenize(hypothesis);
    Ok(reference.stats_for_tokens(&tokens).score())
}

/// Hypothesis-side counts, updated one token at a time in O(1).
#[derive(Debug, Clone)]
pub(crate) struct HypothesisState {
    /// Ids of hypothesis tokens that the reference lacks (they never match but count for repetition).
    extra_vocab: HashMap<String, u32>,
    /// Last three token ids, most recent last.
    history: [u32; 3],
    len: usize,
    /// Hypothesis count of each reference n-gram, by `RefNgram::slot`.
    matched_counts: Vec<u32>,
    correct: [u64; MAX_ORDER],
    total: [u64; MAX_ORDER],
    trigrams: HashSet<[u32; 3]>,
    trigram_total: u64,
}

/// Window of the last MAX_ORDER ids ending at `id`.
fn window_with(history: [u32; 3], id: u32) -> NgramKey {
    [history[0], history[1], history[2], id]
}

impl HypothesisState {
    pub(crate) fn new(reference: &BleuReference) -> Self {
        Self {
            extra_vocab: HashMap::new(),
            history: [u32::MAX; 3],
            len: 0,
            matched_counts: vec![0; reference.ngrams.len()],
            correct: [0; MAX_ORDER],
            total: [0; MAX_ORDER],
            trigrams: HashSet::new(),
            trigram_total: 0,
        }
    }

    /// Id of `token`, interning it (one allocation, the first time only) when the reference lacks it.
    fn intern(&mut self, reference: &BleuReference, token: &str) -> u32 {
        if let Some(&id) = reference.vocab.get(token) {
            return id;
        }
        if let Some(&id) = self.extra_vocab.get(token) {
            return id;
        }
        let id = reference.vocab_len() + self.extra_vocab.len() as u32;
        self.extra_vocab.insert(token.to_owned(), id);
        id
    }

    /// Adds one token.
    pub(crate) fn push(&mut self, reference: &BleuReference, token: &str) {
        let id = self.intern(reference, token);
        self.len += 1;
        let window = window_with(self.history, id);
        let orders = MAX_ORDER.min(self.len);
        for total in &mut self.total[..orders] {
            *total += 1;
        }
        // n-grams ending here, shortest first: a reference holding an n-gram also holds its
        // (n-1)-suffix, so the first miss ends the search.
        for n in 1..=orders {
            let Some(found) = reference_ngram(reference, &window, n) else { break };
            let count = &mut self.matched_counts[found.slot as usize];
            *count += 1;
            if *count <= found.max_count {
                self.correct[n - 1] += 1;
            }
        }
        if self.len >= 3 {
            self.trigram_total += 1;
            self.trigrams.insert([window[1], window[2], window[3]]);
        }
        self.history = [window[1], window[2], window[3]];
    }

    pub(crate) fn stats(&self, reference: &BleuReference) -> BleuStats {
        BleuStats {
            sys_len: self.len,
            ref_len: reference.closest_length(self.len),
            correct: self.correct,
            total: self.total,
        }
    }

    /// 1 - distinct 3-grams / total 3-grams (0 when there is no 3-gram).
    #[cfg(test)]
    pub(crate) fn repetition_ratio(&self) -> f64 {
        ratio(self.trigrams.len() as u64, self.trigram_total)
    }

    /// Statistics and repetition ratio as if `pending` tokens were pushed, without pushing them.
    ///
    /// Reading a stream's score mid-answer must not change the state; the few
    /// tokens of the unfinished word are counted here against small local overlays.
    fn stats_with(
        &self,
        reference: &BleuReference,
        pending: &PendingTokens,
        overlay: &mut Overlay,
    ) -> (BleuStats, f64) {
        let mut len = self.len;
        let mut history = self.history;
        let (mut correct, mut total) = (self.correct, self.total);
        let (mut trigram_total, mut distinct) = (self.trigram_total, self.trigrams.len() as u64);
        overlay.clear();
        for token in pending.tokens() {
            let id = match reference.vocab.get(token).or_else(|| self.extra_vocab.get(token)) {
                Some(&id) => id,
                None => overlay.unknown_id(token, reference.vocab_len() + self.extra_vocab.len() as u32),
            };
            len += 1;
            let window = window_with(history, id);
            let orders = MAX_ORDER.min(len);
            for t in &mut total[..orders] {
                *t += 1;
            }
            for n in 1..=orders {
                let Some(found) = reference_ngram(reference, &window, n) else { break };
                let count = self.matched_counts[found.slot as usize] + overlay.bump(found.slot);
                if count <= found.max_count {
                    correct[n - 1] += 1;
                }
            }
            if len >= 3 {
                trigram_total += 1;
                let trigram = [window[1], window[2], window[3]];
                if !self.trigrams.contains(&trigram) && !overlay.trigrams.contains(&trigram) {
                    overlay.trigrams.push(trigram);
                    distinct += 1;
                }
            }
            history = [window[1], window[2], window[3]];
        }
        let stats = BleuStats { sys_len: len, ref_len: reference.closest_length(len), correct, total };
        (stats, ratio(distinct, trigram_total))
    }
}

/// The reference n-gram of order `n` at the end of `window`, if the reference has it.
///
/// An n-gram with a token the reference lacks (id >= its vocabulary) cannot match.
fn reference_ngram(reference: &BleuReference, window: &NgramKey, n: usize) -> Option<RefNgram> {
    let ids = &window[MAX_ORDER - n..];
    if ids.iter().any(|&i| i >= reference.vocab_len()) {
        return None;
    }
    reference.ngrams.get(&ngram_key(ids)).copied()
}

/// 1 - distinct / total, 0 for no 3-gram.
fn ratio(distinct: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        1.0 - distinct as f64 / total as f64
    }
}

/// Local changes while evaluating pending tokens: a handful of entries, so linear scans.
#[derive(Debug, Clone, Default)]
struct Overlay {
    /// (slot, extra count) of reference n-grams the pending tokens added to.
    bumps: Vec<(u32, u32)>,
    /// Pending tokens unknown to both vocabularies, in order of first appearance.
    unknown: Vec<String>,
    unknown_len: usize,
    trigrams: Vec<[u32; 3]>,
}

impl Overlay {
    fn clear(&mut self) {
        self.bumps.clear();
        self.unknown_len = 0;
        self.trigrams.clear();
    }

    /// Adds 1 to the local count of `slot` and returns the new local count.
    fn bump(&mut self, slot: u32) -> u32 {
        if let Some(entry) = self.bumps.iter_mut().find(|(s, _)| *s == slot) {
            entry.1 += 1;
            return entry.1;
        }
        self.bumps.push((slot, 1));
        1
    }

    /// The id an unknown pending token would get when pushed, given the next free id.
    fn unknown_id(&mut self, token: &str, next_free: u32) -> u32 {
        if let Some(i) = self.unknown[..self.unknown_len].iter().position(|t| t == token) {
            return next_free + i as u32;
        }
        // Reuse the strings' capacity across reads.
        if self.unknown_len == self.unknown.len() {
            self.unknown.push(String::new());
        }
        let slot = &mut self.unknown[self.unknown_len];
        slot.clear();
        slot.push_str(token);
        self.unknown_len += 1;
        next_free + self.unknown_len as u32 - 1
    }
}

/// Tokens of the unfinished tail of a stream, in reusable buffers.
#[derive(Debug, Clone, Default)]
struct PendingTokens {
    text: String,
    ends: Vec<usize>,
}

impl PendingTokens {
    fn clear(&mut self) {
        self.text.clear();
        self.ends.clear();
    }

    fn push(&mut self, token: &str) {
        self.text.push_str(token);
        self.ends.push(self.text.len());
    }

    fn tokens(&self) -> impl Iterator<Item = &str> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(self.ends.iter().copied()).map(|(start, end)| &self.text[start..end])
    }
}

/// Removes or replaces a fixed pattern in a character stream, like Python's `str.replace`.
///
/// Valid for patterns whose first character occurs nowhere else in them (all 13a
/// patterns): then a mismatch never hides the start of another match.
#[derive(Debug, Clone, Copy)]
struct PatternFilter {
    pattern: &'static [char],
    replacement: Option<char>,
    matched: usize,
}

/// Up to a pattern prefix plus one character.
#[derive(Debug, Clone, Copy)]
struct Emitted {
    chars: [char; 10],
    len: usize,
}

impl Emitted {
    fn new() -> Self {
        Self { chars: ['\0'; 10], len: 0 }
    }
    fn push(&mut self, c: char) {
        self.chars[self.len] = c;
        self.len += 1;
    }
    fn as_slice(&self) -> &[char] {
        &self.chars[..self.len]
    }
}

impl PatternFilter {
    const fn new(pattern: &'static [char], replacement: Option<char>) -> Self {
        Self { pattern, replacement, matched: 0 }
    }

    fn push(&mut self, c: char) -> Emitted {
        let mut out = Emitted::new();
        if c == self.pattern[self.matched] {
            self.matched += 1;
            if self.matched == self.pattern.len() {
                self.matched = 0;
                if let Some(r) = self.replacement {
                    out.push(r);
                }
            }
            return out;
        }
        for &p in &self.pattern[..self.matched] {
            out.push(p);
        }
        if c == self.pattern[0] {
            self.matched = 1;
        } else {
            self.matched = 0;
            out.push(c);
        }
        out
    }

    fn flush(&mut self) -> Emitted {
        let mut out = Emitted::new();
        for &p in &self.pattern[..self.matched] {
            out.push(p);
        }
        self.matched = 0;
        out
    }
}

const SKIPPED: &[char] = &['<', 's', 'k', 'i', 'p', 'p', 'e', 'd', '>'];
const DASH_NEWLINE: &[char] = &['-', '\n'];
const QUOT: &[char] = &['&', 'q', 'u', 'o', 't', ';'];
const AMP: &[char] = &['&', 'a', 'm', 'p', ';'];
const LT: &[char] = &['&', 'l', 't', ';'];
const GT: &[char] = &['&', 'g', 't', ';'];

/// Whether `c` passes every filter unchanged when none is part-way through a match:
/// it starts no pattern, and it is not the newline that stage 2 turns into a space.
fn passes_filters(c: char) -> bool {
    !matches!(c, '<' | '-' | '&' | '\n')
}

/// Streaming form of the 13a preprocessing: text deltas in, completed words out.
///
/// Stages in sacreBLEU's order: rstrip (trailing whitespace is held back until
/// more text arrives), remove `<skipped>`, remove `-\n`, `\n` -> space, then the
/// four entity replacements, then split into words on Python whitespace.
#[derive(Debug, Clone)]
pub(crate) struct TextPipeline {
    held_whitespace: String,
    /// skipped, dash-newline, quot, amp, lt, gt (newline->space sits between 1 and 2).
    filters: [PatternFilter; 6],
    /// How many filters are part-way through a match; 0 allows the fast path.
    busy_filters: usize,
    word: String,
}

impl TextPipeline {
    pub(crate) fn new() -> Self {
        Self {
            held_whitespace: String::new(),
            filters: [
                PatternFilter::new(SKIPPED, None),
                PatternFilter::new(DASH_NEWLINE, None),
                PatternFilter::new(QUOT, Some('"')),
                PatternFilter::new(AMP, Some('&')),
                PatternFilter::new(LT, Some('<')),
                PatternFilter::new(GT, Some('>')),
            ],
            busy_filters: 0,
            word: String::new(),
        }
    }

    /// Makes `self` a copy of `other`, reusing the string buffers (no allocation once warm).
    fn copy_from(&mut self, other: &Self) {
        self.held_whitespace.clone_from(&other.held_whitespace);
        self.filters = other.filters;
        self.busy_filters = other.busy_filters;
        self.word.clone_from(&other.word);
    }

    /// Feeds raw text; completed words are passed to `on_word`.
    pub(crate) fn push_str(&mut self, text: &str, on_word: &mut impl FnMut(&str)) {
        for c in text.chars() {
            if is_python_whitespace(c) {
                self.held_whitespace.push(c);
                continue;
            }
            if !self.held_whitespace.is_empty() {
                let held = std::mem::take(&mut self.held_whitespace);
                for w in held.chars() {
                    self.feed(w, on_word);
                }
                self.held_whitespace = held;
                self.held_whitespace.clear();
            }
            self.feed(c, on_word);
        }
    }

    /// One character into the filter chain, skipping it when it cannot interact with a filter.
    fn feed(&mut self, c: char, on_word: &mut impl FnMut(&str)) {
        if self.busy_filters == 0 && passes_filters(c) {
            self.split_words(c, on_word);
        } else {
            self.stage(0, c, on_word);
        }
    }

    fn stage(&mut self, index: usize, c: char, on_word: &mut impl FnMut(&str)) {
        if index == self.filters.len() {
            self.split_words(c, on_word);
            return;
        }
        let filter = &mut self.filters[index];
        let was_busy = filter.matched > 0;
        let emitted = filter.push(c);
        let is_busy = filter.matched > 0;
        self.busy_filters = self.busy_filters + usize::from(is_busy) - usize::from(was_busy);
        for &e in emitted.as_slice() {
            // '\n' -> ' ' happens after the dash-newline filter (index 1).
            let e = if index == 1 && e == '\n' { ' ' } else { e };
            self.stage(index + 1, e, on_word);
        }
    }

    /// The last stage: split into words on Python whitespace.
    fn split_words(&mut self, c: char, on_word: &mut impl FnMut(&str)) {
        if is_python_whitespace(c) {
            if !self.word.is_empty() {
                on_word(&self.word);
                self.word.clear();
            }
        } else {
            self.word.push(c);
        }
    }

    /// Ends the text: drops held trailing whitespace (rstrip), flushes every stage.
    pub(crate) fn finish(&mut self, on_word: &mut impl FnMut(&str)) {
        self.held_whitespace.clear();
        for index in 0..self.filters.len() {
            let emitted = self.filters[index].flush();
            for &e in emitted.as_slice() {
                let e = if index == 1 && e == '\n' { ' ' } else { e };
                self.stage(index + 1, e, on_word);
            }
        }
        self.busy_filters = 0;
        if !self.word.is_empty() {
            on_word(&self.word);
            self.word.clear();
        }
    }
}

/// Streaming BLEU and repetition: push text deltas, read the score at any time.
///
/// Each delta costs O(its length) amortised; reading costs O(the unfinished word)
/// and changes nothing. The result always equals [`sentence_bleu`] of the concatenated text.
#[derive(Debug, Clone)]
pub struct StreamingBleu {
    reference: std::sync::Arc<BleuReference>,
    pipeline: TextPipeline,
    state: HypothesisState,
    rules: RuleBuffers,
    /// Scratch for reads: a copy of the pipeline to finish, its tokens, and the overlay.
    finishing: TextPipeline,
    pending: PendingTokens,
    overlay: Overlay,
}

impl StreamingBleu {
    /// Starts an empty hypothesis against `reference`.
    pub fn new(reference: std::sync::Arc<BleuReference>) -> Self {
        let state = HypothesisState::new(&reference);
        Self {
            reference,
            pipeline: TextPipeline::new(),
            state,
            rules: RuleBuffers::default(),
            finishing: TextPipeline::new(),
            pending: PendingTokens::default(),
            overlay: Overlay::default(),
        }
    }

    /// Appends a text delta (for example one streamed token's text).
    pub fn push(&mut self, delta: &str) {
        let Self { reference, pipeline, state, rules, .. } = self;
        let tokenizer = reference.tokenizer;
        pipeline.push_str(delta, &mut |word| {
            tokenizer.word_tokens(word, rules, &mut |token| state.push(reference, token));
        });
    }

    /// Statistics and repetition ratio as if the text ended now; the stream is unchanged.
    fn finished_now(&mut self) -> (BleuStats, f64) {
        let Self { reference, pipeline, state, rules, finishing, pending, overlay } = self;
        finishing.copy_from(pipeline);
        pending.clear();
        let tokenizer = reference.tokenizer;
        finishing.finish(&mut |word| tokenizer.word_tokens(word, rules, &mut |token| pending.push(token)));
        state.stats_with(reference, pending, overlay)
    }

    /// BLEU of the text so far.
    pub fn score(&mut self) -> BleuScore {
        self.finished_now().0.score()
    }

    /// BLEU and repetition ratio of the text so far.
    pub fn score_and_repetition(&mut self) -> (BleuScore, f64) {
        let (stats, repetition) = self.finished_now();
        (stats.score(), repetition)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;

    /// The 13a rules as sacreBLEU writes them (regexes), the oracle for the hand-written passes.
    fn regex_rules(text: &str) -> String {
        let rules = [
            (r"([\x7B-\x7E\x5B-\x60\x20-\x26\x28-\x2B\x3A-\x40\x2F])", " ${1} "),
            (r"([^0-9])([\.,])", "${1} ${2} "),
            (r"([\.,])([^0-9])", " ${1} ${2}"),
            (r"([0-9])(-)", "${1} ${2} "),
        ];
        let mut line = text.to_owned();
        for (pattern, replacement) in rules {
            line = regex::Regex::new(pattern).unwrap().replace_all(&line, replacement).into_owned();
        }
        line
    }

    #[test]
    fn identical_sentence_scores_100() {
        let s = sentence_bleu("The cat sat on the mat.", &["The cat sat on the mat."]).unwrap();
        assert!((s.score - 100.0).abs() < 1e-9);
    }

    #[test]
    fn empty_references_are_an_error() {
        let none: [&str; 0] = [];
        assert!(sentence_bleu("x", &none).is_err());
    }

    #[test]
    fn tokenizer_examples() {
        let t = Tokenizer13a::new();
        assert_eq!(
            t.tokenize("Hello, world. 3.14 and 1,000!"),
            ["Hello", ",", "world", ".", "3.14", "and", "1,000", "!"]
        );
        assert_eq!(t.tokenize("5-3 x-y"), ["5", "-", "3", "x-y"]);
        assert_eq!(t.tokenize("a &amp; b-\nc"), ["a", "&", "bc"]);
        assert_eq!(t.tokenize("trailing-\n"), ["trailing-"]);
    }

    fn streamed(text: &str, split: &[usize]) -> (BleuScore, f64, BleuScore, f64) {
        let reference =
            Arc::new(BleuReference::new(&["the cat sat on the mat. 3.5 x-y &amp; <skipped>"]).unwrap());
        let mut s = StreamingBleu::new(reference.clone());
        let chars: Vec<char> = text.chars().collect();
        let mut start = 0;
        for &cut in split {
            let cut = cut.min(chars.len()).max(start);
            s.push(&chars[start..cut].iter().collect::<String>());
            start = cut;
        }
        s.push(&chars[start..].iter().collect::<String>());
        let (streaming, rep) = s.score_and_repetition();
        let mut batch_state = HypothesisState::new(&reference);
        for tok in reference.tokenizer().tokenize(text) {
            batch_state.push(&reference, &tok);
        }
        (streaming, rep, batch_state.stats(&reference).score(), batch_state.repetition_ratio())
    }

    #[test]
    fn reading_mid_stream_does_not_disturb_state() {
        let reference = Arc::new(BleuReference::new(&["a b c d e f"]).unwrap());
        let mut s = StreamingBleu::new(reference);
        s.push("a b c");
        let mid = s.score();
        let mid_again = s.score();
        assert_eq!(mid, mid_again);
        s.push(" d e f");
        assert!((s.score().score - 100.0).abs() < 1e-9);
    }

    proptest! {
        #[test]
        fn streaming_equals_batch(
            pieces in prop::collection::vec(prop::sample::select(vec![
                "the", " ", "cat", "sat", ".", ",", "3", "5", "-", "\n", "-\n", "<skip", "ped>", "<skipped>",
                "&amp;", "&am", "p;", "&quot;", "&lt;", "&gt;", "x", "y", "\t", "\u{1c}", "é", "mat", "  ", "(", ")",
            ]), 0..60),
            split in prop::collection::vec(0usize..200, 0..20),
        ) {
            let text: String = pieces.concat();
            let mut split = split;
            split.sort();
            let (s, rep, b, brep) = streamed(&text, &split);
            prop_assert_eq!(s.stats, b.stats, "text {:?}", text);
            prop_assert_eq!(s.score.to_bits(), b.score.to_bits());
            prop_assert_eq!(rep.to_bits(), brep.to_bits());
        }

        #[test]
        fn every_mid_stream_read_equals_batch_of_the_prefix(
            pieces in prop::collection::vec(prop::sample::select(vec![
                "the", " ", "cat", "sat", ".", ",", "3", "5", "-", "\n", "-\n", "<skip", "ped>", "&am", "p;",
                "&lt;", "x", "y", "zz", "\t", "mat", "(", ")", " the cat", " sat on", "on", "mat.", "x y x y",
            ]), 0..50),
        ) {
            let reference = Arc::new(
                BleuReference::new(&["the cat sat on the mat. 3.5 x-y", "on the mat the cat sat"]).unwrap(),
            );
            let mut stream = StreamingBleu::new(reference.clone());
            let mut text = String::new();
            for piece in &pieces {
                stream.push(piece);
                text.push_str(piece);
                let (streaming, rep) = stream.score_and_repetition();
                let mut batch = HypothesisState::new(&reference);
                for token in reference.tokenizer().tokenize(&text) {
                    batch.push(&reference, &token);
                }
                prop_assert_eq!(streaming.stats, batch.stats(&reference), "text {:?}", text);
                prop_assert_eq!(streaming.score.to_bits(), batch.stats(&reference).score().score.to_bits());
                prop_assert_eq!(rep.to_bits(), batch.repetition_ratio().to_bits(), "text {:?}", text);
            }
        }

        #[test]
        fn word_decomposition_equals_line_tokenization(
            pieces in prop::collection::vec(prop::sample::select(vec![
                "a", "1", ".", ",", "-", " ", "\t", "$", "&", "'", "\"", "(", "/", "é", "x.5", "5.x", ".,", "\u{a0}",
            ]), 0..40),
        ) {
            let text: String = pieces.concat();
            let t = Tokenizer13a::new();
            let mut by_word = Vec::new();
            let mut buffers = RuleBuffers::default();
            for word in text.split(is_python_whitespace).filter(|w| !w.is_empty()) {
                t.word_tokens(word, &mut buffers, &mut |token| by_word.push(token.to_owned()));
            }
            prop_assert_eq!(by_word, t.tokenize(&text));
        }

        #[test]
        fn hand_written_rules_equal_the_13a_regexes(
            pieces in prop::collection::vec(prop::sample::select(vec![
                "a", "Z", "0", "9", "5", ".", ",", "-", " ", "'", "\"", "$", "&", "(", ")", "/", "@", "[", "`", "{", "~",
                "+", ":", "?", "_", "é", "\u{a0}", "\n", "\t", "..", ",,", "-.", ".-", "1.", ".1", "x,", ",x", "日",
            ]), 0..40),
        ) {
            let text: String = pieces.concat();
            let mut buffers = RuleBuffers::default();
            Tokenizer13a::new().apply_rules(&text, &mut buffers);
            prop_assert_eq!(buffers.a, regex_rules(&format!(" {text} ")));
        }
    }
}
