package raysearch;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.lucene.analysis.Analyzer;
import org.apache.lucene.analysis.TokenStream;
import org.apache.lucene.analysis.tokenattributes.CharTermAttribute;
import org.apache.lucene.index.IndexReader;
import org.apache.lucene.index.LeafReaderContext;
import org.apache.lucene.index.NumericDocValues;
import org.apache.lucene.index.PostingsEnum;
import org.apache.lucene.index.Term;
import org.apache.lucene.index.TermState;
import org.apache.lucene.index.Terms;
import org.apache.lucene.index.TermsEnum;
import org.apache.lucene.search.BooleanClause;
import org.apache.lucene.search.BooleanQuery;
import org.apache.lucene.search.BoostQuery;
import org.apache.lucene.search.CollectionStatistics;
import org.apache.lucene.search.CollectorManager;
import org.apache.lucene.search.DocIdSetIterator;
import org.apache.lucene.search.IndexSearcher;
import org.apache.lucene.search.Query;
import org.apache.lucene.search.ScoreDoc;
import org.apache.lucene.search.ScoreMode;
import org.apache.lucene.search.Scorer;
import org.apache.lucene.search.TermInSetQuery;
import org.apache.lucene.search.TermQuery;
import org.apache.lucene.search.TermStatistics;
import org.apache.lucene.search.TopDocs;
import org.apache.lucene.search.TopScoreDocCollector;
import org.apache.lucene.search.Weight;
import org.apache.lucene.search.similarities.BM25Similarity;
import org.apache.lucene.search.similarities.PerFieldSimilarityWrapper;
import org.apache.lucene.search.similarities.Similarity;
import org.apache.lucene.util.BytesRef;

/**
 * One BM25 search of one shard in one call from Python.
 *
 * <p>Through pyjnius every Java object that reaches Python becomes a proxy (about 4 us each) and every
 * call a JNI crossing; a query of 20 terms and 200 hits cost ~1.1 ms of such plumbing per shard against
 * ~0.2 ms of Lucene's own work. Here the boosted query is built and the hits read in Java, and only
 * primitive arrays cross: the terms and boosts in, the Lucene doc numbers and scores out. The query is
 * the same bag-of-words BooleanQuery the Python path builds, so both score identically.
 *
 * <p>Only Lucene classes are used, so it compiles with any JDK from 11 on against the jar Pyserini ships.
 */
public final class ShardSearch {
  /** Lucene doc numbers of the hits, best first. */
  public final int[] docs;
  /** Their BM25 scores. */
  public final float[] scores;

  private ShardSearch(int[] docs, float[] scores) {
    this.docs = docs;
    this.scores = scores;
  }

  /** The analyzed terms of a text, as the indexer produced them (stemmed, stopwords removed). */
  public static String[] analyze(Analyzer analyzer, String field, String text) throws IOException {
    List<String> out = new ArrayList<>();
    try (TokenStream stream = analyzer.tokenStream(field, text)) {
      CharTermAttribute term = stream.addAttribute(CharTermAttribute.class);
      stream.reset();
      while (stream.incrementToken()) {
        out.add(term.toString());
      }
      stream.end();
    }
    return out.toArray(new String[0]);
  }

  /** One query's top-k collector manager, shared by the shards of a group searched one after another. */
  public static CollectorManager<TopScoreDocCollector, TopDocs> sharedTopK(int k) {
    return TopScoreDocCollector.createSharedManager(k, null, k);
  }

  /** Lucene 9's BM25 idf: ln(1 + (N - df + 0.5) / (df + 0.5)). */
  static double idf(long docCount, long df) {
    return Math.log(1 + (docCount - df + 0.5) / (df + 0.5));
  }

  /**
   * BM25 with its own (k1, b) for each field (Lucene's {@link PerFieldSimilarityWrapper}): a shard makes each
   * field's length norm equal the corpus's with that field's own (k1', b'), since each field has its own
   * average length. A field not named scores with the first one's parameters. Set once on the shard's
   * searcher: the per-query weights of the fields are clause boosts, not parameters.
   */
  public static Similarity perFieldBM25(String[] fields, float[] k1s, float[] bs) {
    Map<String, Similarity> byField = new HashMap<>();
    for (int i = 0; i < fields.length; i++) {
      byField.put(fields[i], new BM25Similarity(k1s[i], bs[i]));
    }
    Similarity first = fields.length > 0 ? byField.get(fields[0]) : new BM25Similarity();
    return new PerFieldSimilarityWrapper() {
      @Override
      public Similarity get(String name) {
        return byField.getOrDefault(name, first);
      }
    };
  }

  /**
   * Top-k by corpus-exact BM25 over this shard: one SHOULD clause {@code BoostQuery(TermQuery(fields[i]:terms[i]),
   * b)} per (field, distinct query term) pair, with {@code b = factors[i] * idf(corpusDocs[i], corpusDf[i]) /
   * idf(shardDocs[i], shardDf)} so the shard's idf of the term in that field becomes the corpus's ({@code
   * factors[i]}: the term's count in the query times the field's weight); pairs absent from the shard or the
   * corpus are left out, and at most {@code maxClauses} are kept. The score is thus the weighted sum of the
   * fields' BM25 (Elasticsearch's {@code multi_match} of type {@code most_fields}). With {@code allowedIds}
   * (values of {@code idField}) not null, only those documents can match, as a FILTER clause with at least one
   * SHOULD clause required. No clause at all: no hits.
   *
   * <p>{@code shared} (may be null) is one query's top-k collector manager shared by the shards searched one
   * after another (see {@link #sharedTopK}): once any shard has k hits, its k-th score bounds the whole
   * group's k-th score, and the next shards skip every block that cannot reach it. Scores are comparable
   * across shards because each is corpus-exact, so the group's merged top k is unchanged.
   */
  public static ShardSearch search(
      IndexSearcher searcher, String[] fields, String[] terms, double[] factors, long[] corpusDf,
      long[] corpusDocs, long[] shardDocs, int maxClauses, int k, String idField, String[] allowedIds,
      CollectorManager<TopScoreDocCollector, TopDocs> shared) throws IOException {
    BooleanQuery.Builder builder = new BooleanQuery.Builder();
    int clauses = addClauses(builder, searcher, fields, terms, factors, corpusDf, corpusDocs, shardDocs, maxClauses);
    if (clauses == 0 || k <= 0 || (allowedIds != null && allowedIds.length == 0)) {
      return new ShardSearch(new int[0], new float[0]);
    }
    if (allowedIds != null) {
      List<BytesRef> ids = new ArrayList<>(allowedIds.length);
      for (String id : allowedIds) {
        ids.add(new BytesRef(id));
      }
      builder.add(new TermInSetQuery(idField, ids), BooleanClause.Occur.FILTER);
      // With a FILTER clause the SHOULD clauses become optional: without this every allowed document
      // would match with score 0.
      builder.setMinimumNumberShouldMatch(1);
    }
    // Total hits are never reported, so they are not counted past k: block skipping starts at the k-th hit.
    TopScoreDocCollector collector =
        shared != null ? shared.newCollector() : TopScoreDocCollector.create(k, null, k);
    searcher.search(builder.build(), collector);
    TopDocs top = collector.topDocs();
    int n = top.scoreDocs.length;
    int[] docs = new int[n];
    float[] scores = new float[n];
    for (int i = 0; i < n; i++) {
      ScoreDoc sd = top.scoreDocs[i];
      docs[i] = sd.doc;
      scores[i] = sd.score;
    }
    return new ShardSearch(docs, scores);
  }

  /** The corpus-exact boosted term clauses of {@link #search}, added to {@code builder}; returns how many. */
  static int addClauses(
      BooleanQuery.Builder builder, IndexSearcher searcher, String[] fields, String[] terms, double[] factors,
      long[] corpusDf, long[] corpusDocs, long[] shardDocs, int maxClauses) throws IOException {
    int clauses = 0;
    for (int i = 0; i < terms.length && clauses < maxClauses; i++) {
      Term term = new Term(fields[i], terms[i]);
      long shardDf = searcher.getIndexReader().docFreq(term);
      if (shardDf == 0 || corpusDf[i] == 0) {
        continue;
      }
      double boost = factors[i] * idf(corpusDocs[i], corpusDf[i]) / idf(shardDocs[i], shardDf);
      builder.add(new BoostQuery(new TermQuery(term), (float) boost), BooleanClause.Occur.SHOULD);
      clauses++;
    }
    return clauses;
  }

  /**
   * The score {@link #search} gives each of the Lucene documents {@code docs} (0 where no clause matches), read by
   * advancing the query's scorer to each of them in doc order: a ranking model's BM25 of a few hundred chosen
   * candidates without a filter of their ids (a {@code TermInSetQuery} of 200 ids cost ~1 ms a field and shard).
   */
  public static float[] scoreDocs(
      IndexSearcher searcher, String[] fields, String[] terms, double[] factors, long[] corpusDf,
      long[] corpusDocs, long[] shardDocs, int maxClauses, int[] docs) throws IOException {
    float[] out = new float[docs.length];
    BooleanQuery.Builder builder = new BooleanQuery.Builder();
    if (docs.length == 0
        || addClauses(builder, searcher, fields, terms, factors, corpusDf, corpusDocs, shardDocs, maxClauses) == 0) {
      return out;
    }
    Query query = searcher.rewrite(builder.build());
    Weight weight = searcher.createWeight(query, ScoreMode.COMPLETE, 1f);
    int[] order = inDocOrder(docs);
    for (LeafReaderContext leaf : searcher.getIndexReader().leaves()) {
      Scorer scorer = weight.scorer(leaf);
      if (scorer == null) {
        continue;
      }
      eachHeld(scorer.iterator(), docs, order, leaf, (j, local) -> out[j] = scorer.score());
    }
    return out;
  }

  /** What {@link #candidateFacts} reads of chosen documents. */
  public static final class CandidateFacts {
    /** The BM25 of {@code fieldNames[i]} of {@code docs[j]}, at {@code scores[i * docs.length + j]}. */
    public final float[] scores;
    /** Bit t of {@code masks[j]} set when the mask field of {@code docs[j]} holds {@code maskTerms[t]}. */
    public final long[] masks;

    private CandidateFacts(float[] scores, long[] masks) {
      this.scores = scores;
      this.masks = masks;
    }
  }

  /**
   * A ranking model's BM25 of each field and query-term coverage of the Lucene documents {@code docs}, in one pass
   * over the postings: each field's score is what {@link #scoreDocs} gives with that field's clauses alone (the
   * clauses as {@link #addClauses} keeps them, at most {@code maxClauses} a field), computed the way Lucene's
   * TermQuery and BooleanQuery do (each term's similarity scorer of its frequency and the document's norm, summed
   * in double), without building the query; {@code masks} are {@link #termMasks} of {@code maskTerms} in {@code
   * maskField}, read from the same postings where a clause holds the term. The scorer of a disjunction, advanced
   * to each candidate, cost more than the postings it reads. Clause i is {@code terms[i]} of the field {@code
   * fieldNames[clauseFields[i]]}; {@code corpusDocs} and {@code shardDocs} are the fields' document counts.
   */
  private static CandidateFacts candidateFacts(
      IndexSearcher searcher, String[] fieldNames, int[] clauseFields, String[] terms, double[] factors,
      long[] corpusDf, long[] corpusDocs, long[] shardDocs, int maxClauses, String maskField, String[] maskTerms,
      int[] docs) throws IOException {
    int n = docs.length;
    double[] sums = new double[fieldNames.length * n];
    long[] masks = new long[n];
    if (n == 0) {
      return new CandidateFacts(new float[0], masks);
    }
    Map<String, Integer> maskBit = new HashMap<>();
    for (int t = 0; t < Math.min(maskTerms.length, 64); t++) {
      maskBit.put(maskTerms[t], t);
    }
    Similarity similarity = searcher.getSimilarity();
    List<LeafReaderContext> leaves = searcher.getIndexReader().leaves();
    // One terms enum a field and leaf, seeked for each of the field's terms: the term's statistics and its state
    // in each leaf come from one seek (TermStates.build would open an enum a term and leaf, and the postings then
    // another).
    TermsEnum[][] enums = new TermsEnum[fieldNames.length][leaves.size()];
    List<BytesRef> kept = new ArrayList<>();
    List<TermState[]> states = new ArrayList<>();
    List<Similarity.SimScorer> scorers = new ArrayList<>();
    List<Integer> fieldOf = new ArrayList<>();
    List<Integer> bitOf = new ArrayList<>();
    int[] clauses = new int[fieldNames.length];
    CollectionStatistics[] collections = new CollectionStatistics[fieldNames.length];
    long covered = 0L; // mask bits read from a clause's postings
    for (int i = 0; i < terms.length; i++) {
      int f = clauseFields[i];
      if (clauses[f] >= maxClauses || corpusDf[i] == 0) {
        continue;
      }
      BytesRef bytes = new BytesRef(terms[i]);
      TermState[] perLeaf = new TermState[leaves.size()];
      long shardDf = 0L;
      long totalTermFreq = 0L;
      for (int l = 0; l < leaves.size(); l++) {
        TermsEnum termsEnum = termsEnum(enums, f, l, leaves.get(l), fieldNames[f]);
        if (termsEnum != null && termsEnum.seekExact(bytes)) {
          shardDf += termsEnum.docFreq();
          totalTermFreq += termsEnum.totalTermFreq();
          perLeaf[l] = termsEnum.termState();
        }
      }
      if (shardDf == 0) {
        continue;
      }
      clauses[f]++;
      float boost = (float) (factors[i] * idf(corpusDocs[f], corpusDf[i]) / idf(shardDocs[f], shardDf));
      if (collections[f] == null) {
        collections[f] = searcher.collectionStatistics(fieldNames[f]);
      }
      kept.add(bytes);
      states.add(perLeaf);
      scorers.add(similarity.scorer(boost, collections[f], new TermStatistics(bytes, shardDf, totalTermFreq)));
      fieldOf.add(f);
      Integer bit = fieldNames[f].equals(maskField) ? maskBit.get(terms[i]) : null;
      bitOf.add(bit == null ? -1 : bit);
      if (bit != null) {
        covered |= 1L << bit;
      }
    }
    int[] order = inDocOrder(docs);
    PostingsEnum[] reuse = new PostingsEnum[fieldNames.length]; // one enum a field, reset for each of its terms
    for (int l = 0; l < leaves.size(); l++) {
      LeafReaderContext leaf = leaves.get(l);
      // Each field's norm of each candidate in this leaf, read once (in doc order) for all the field's terms.
      long[][] normOf = new long[fieldNames.length][];
      for (int c = 0; c < kept.size(); c++) {
        TermState state = states.get(c)[l];
        if (state == null) {
          continue;
        }
        int f = fieldOf.get(c);
        if (normOf[f] == null) {
          normOf[f] = norms(leaf, fieldNames[f], docs, order);
        }
        long[] norm = normOf[f];
        TermsEnum termsEnum = enums[f][l];
        termsEnum.seekExact(kept.get(c), state);
        PostingsEnum postings = termsEnum.postings(reuse[f], PostingsEnum.FREQS);
        reuse[f] = postings;
        Similarity.SimScorer scorer = scorers.get(c);
        int offset = f * n;
        int bit = bitOf.get(c);
        eachHeld(postings, docs, order, leaf, (j, local) -> {
          sums[offset + j] += scorer.score(postings.freq(), norm[j]);
          if (bit >= 0) {
            masks[j] |= 1L << bit;
          }
        });
      }
    }
    String[] rest = new String[Math.min(maskTerms.length, 64)];
    for (int t = 0; t < rest.length; t++) {
      rest[t] = (covered >> t & 1L) == 0 ? maskTerms[t] : null; // held in no clause: read on their own
    }
    long[] others = termMasks(searcher.getIndexReader(), maskField, rest, docs);
    for (int j = 0; j < n; j++) {
      masks[j] |= others[j];
    }
    float[] scores = new float[sums.length];
    for (int k = 0; k < sums.length; k++) {
      scores[k] = (float) sums[k];
    }
    return new CandidateFacts(scores, masks);
  }

  /**
   * The shards of one version as a ranking model's features read them, kept in the JVM: a query's call then carries
   * only what changes with the query. Every argument that crosses from Python costs by its elements (a list of 200
   * ints about 70 us, a searcher or a string a few us each), so the searchers and the fields' document counts are
   * given once, and the query's terms and candidates cross as one string and one byte array.
   */
  public static final class Shards {
    private final IndexSearcher[] searchers;
    private final String[] fieldNames;
    private final long[] fieldDocs;
    private final long[] corpusDocs;
    private final String maskField;

    /**
     * {@code fieldNames}: the fields scored, in the order of the scores; {@code fieldDocs[s * fieldNames.length + f]}:
     * Lucene's document count of field f in shard s; {@code corpusDocs[f]}: the corpus's; {@code maskField}: the
     * field whose terms the masks read.
     */
    public Shards(IndexSearcher[] searchers, String[] fieldNames, long[] fieldDocs, long[] corpusDocs,
        String maskField) {
      this.searchers = searchers;
      this.fieldNames = fieldNames;
      this.fieldDocs = fieldDocs;
      this.corpusDocs = corpusDocs;
      this.maskField = maskField;
    }

    /**
     * {@link #candidateFacts} of each shard for one query, in the order of {@code docs}, with each candidate's
     * query-term coverage: clause i is the term {@code terms.split("\n")[i]} of the field
     * {@code fieldNames[clauseFields[i]]} with {@code factors[i]} and {@code corpusDf[i]}; {@code maskTerms} are
     * joined by newlines too, {@code maskWeights[t]} the weight (the corpus idf) of mask term t; {@code docs} holds
     * the candidates' Lucene doc numbers as little-endian 32-bit integers, shard s's the next {@code counts[s]}.
     *
     * <p>One little-endian byte array comes back (a Java array of numbers would cross to Python element by
     * element): for {@code total} candidates, each field's BM25 as {@code float}s (field after field), the share of
     * the mask terms each holds, the same weighted by {@code maskWeights} (both {@code float}s, 0 without mask
     * terms), then the masks as {@code long}s. The shares are the arithmetic of the Python
     * {@code deployments.shard.features.coverage}, in {@code float}.
     */
    public byte[] facts(int[] clauseFields, String terms, double[] factors, long[] corpusDf, int maxClauses,
        String maskTerms, double[] maskWeights, int[] counts, byte[] docs) throws IOException {
      String[] termOf = lines(terms, clauseFields.length);
      String[] masked = lines(maskTerms, maskWeights.length);
      int[] all = new int[docs.length / 4];
      ByteBuffer.wrap(docs).order(ByteOrder.LITTLE_ENDIAN).asIntBuffer().get(all);
      int fields = fieldNames.length;
      int total = all.length;
      ByteBuffer out = ByteBuffer.allocate((fields + 2) * 4 * total + 8 * total).order(ByteOrder.LITTLE_ENDIAN);
      FloatBuffer scores = out.asFloatBuffer(); // each field's scores first, written in place
      long[] masks = new long[total];
      int offset = 0;
      for (int s = 0; s < searchers.length; s++) {
        int n = counts[s];
        if (n > 0) {
          CandidateFacts facts = candidateFacts(searchers[s], fieldNames, clauseFields, termOf, factors, corpusDf,
              corpusDocs, Arrays.copyOfRange(fieldDocs, s * fields, (s + 1) * fields), maxClauses, maskField, masked,
              Arrays.copyOfRange(all, offset, offset + n));
          for (int f = 0; f < fields; f++) {
            scores.position(f * total + offset);
            scores.put(facts.scores, f * n, n);
          }
          System.arraycopy(facts.masks, 0, masks, offset, n);
        }
        offset += n;
      }
      out.position(fields * 4 * total);
      coverage(masks, maskWeights, out);
      out.asLongBuffer().put(masks);
      return out.array();
    }

    /** Writes the plain and the weighted share of the mask terms each of {@code masks} holds, at {@code out}'s
     * position, and moves past them. */
    private static void coverage(long[] masks, double[] weights, ByteBuffer out) {
      int terms = Math.min(weights.length, 64);
      float[] w = new float[terms];
      float sum = 0f;
      for (int t = 0; t < terms; t++) {
        w[t] = (float) weights[t];
        sum += w[t];
      }
      float[] plain = new float[masks.length];
      float[] weighted = new float[masks.length];
      for (int j = 0; j < masks.length && terms > 0; j++) {
        float held = 0f;
        for (long bits = masks[j]; bits != 0; bits &= bits - 1) {
          held += w[Long.numberOfTrailingZeros(bits)];
        }
        plain[j] = (float) Long.bitCount(masks[j]) / (float) terms;
        weighted[j] = sum > 0 ? held / sum : plain[j];
      }
      out.asFloatBuffer().put(plain).put(weighted);
      out.position(out.position() + 8 * masks.length);
    }

    /** {@code joined} split at newlines, which must give {@code expected} lines (one a clause, or a weight). */
    private static String[] lines(String joined, int expected) {
      String[] out = joined.isEmpty() ? new String[0] : joined.split("\n", -1);
      if (out.length != expected) {
        throw new IllegalArgumentException(out.length + " terms for " + expected + " clauses or weights");
      }
      return out;
    }
  }

  /** What {@link #eachHeld} does at each candidate an iterator holds: {@code j}, its index in the candidates. */
  private interface Held {
    void at(int j, int local) throws IOException;
  }

  /**
   * Advances {@code it} (a leaf's postings, or a scorer's iterator) through the candidates {@code docs} that lie in
   * {@code leaf}, in doc order ({@code order}), and calls {@code held} at each one it holds, with the candidate's
   * doc number within the leaf: the one walk every candidate-reading method here makes.
   */
  private static void eachHeld(DocIdSetIterator it, int[] docs, int[] order, LeafReaderContext leaf, Held held)
      throws IOException {
    int start = leaf.docBase;
    int end = start + leaf.reader().maxDoc();
    for (int j : order) {
      int doc = docs[j];
      if (doc < start || doc >= end) {
        continue;
      }
      int local = doc - start;
      int at = it.docID() < local ? it.advance(local) : it.docID();
      if (at == DocIdSetIterator.NO_MORE_DOCS) {
        break;
      }
      if (at == local) {
        held.at(j, local);
      }
    }
  }

  /** The terms enum of field {@code f} in leaf {@code l}, opened on first use; null where the leaf has no such field. */
  private static TermsEnum termsEnum(TermsEnum[][] enums, int f, int l, LeafReaderContext leaf, String field)
      throws IOException {
    if (enums[f][l] == null) {
      Terms terms = leaf.reader().terms(field);
      if (terms == null) {
        return null;
      }
      enums[f][l] = terms.iterator();
    }
    return enums[f][l];
  }

  /** The norm of {@code field} of each of {@code docs} in {@code leaf} (1 without norms, 0 where a doc has none). */
  private static long[] norms(LeafReaderContext leaf, String field, int[] docs, int[] order) throws IOException {
    long[] out = new long[docs.length];
    NumericDocValues norms = leaf.reader().getNormValues(field);
    int start = leaf.docBase;
    int end = start + leaf.reader().maxDoc();
    for (int j : order) {
      int doc = docs[j];
      if (doc >= start && doc < end) {
        out[j] = norms == null ? 1L : (norms.advanceExact(doc - start) ? norms.longValue() : 0L);
      }
    }
    return out;
  }

  /** The indices of {@code docs} in doc order, sorted as packed longs (doc number, then index): no boxing. */
  private static int[] inDocOrder(int[] docs) {
    long[] keys = new long[docs.length];
    for (int j = 0; j < docs.length; j++) {
      keys[j] = ((long) docs[j] << 32) | j;
    }
    Arrays.sort(keys);
    int[] order = new int[docs.length];
    for (int j = 0; j < docs.length; j++) {
      order[j] = (int) keys[j];
    }
    return order;
  }

  /**
   * Which of up to 64 {@code terms} of {@code field} each of the Lucene documents {@code docs} holds: bit i of
   * {@code masks[j]} is set when {@code docs[j]} holds {@code terms[i]}. A ranking model's query-term coverage
   * of a few hundred candidates, read from the postings in one call (a filtered search per term cost ~0.2 ms
   * each through the bridge).
   */
  public static long[] termMasks(IndexReader reader, String field, String[] terms, int[] docs) throws IOException {
    long[] masks = new long[docs.length];
    int[] order = inDocOrder(docs);
    for (LeafReaderContext leaf : reader.leaves()) {
      for (int i = 0; i < Math.min(terms.length, 64); i++) {
        if (terms[i] == null) { // already read by candidateFacts
          continue;
        }
        PostingsEnum postings = leaf.reader().postings(new Term(field, terms[i]), PostingsEnum.NONE);
        if (postings != null) {
          long bit = 1L << i;
          eachHeld(postings, docs, order, leaf, (j, local) -> masks[j] |= bit);
        }
      }
    }
    return masks;
  }
}
