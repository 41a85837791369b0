// The Lucene reference for engram_jax's Lucene-form BM25 leg (experiments.lucene.reference drives it).
//
// Reads episodes from a TSV file (one line per item or question: kind D or Q, episode id, id, text; tab, newline,
// carriage return and backslash in the text escaped as \t \n \r \\), builds one in-memory Lucene index per episode
// with Anserini's default English analyzer (DefaultEnglishAnalyzer.newDefaultInstance(): StandardTokenizer, English
// possessive filter, lower case, Lucene's English stop words, Porter stemmer) and Lucene's BM25Similarity(k1, b),
// searches each question with Anserini's bag-of-words query, and writes a TREC run (the depth given) and, for each
// text, the analyzer's tokens (so that analyzer differences can be named).
//
// Usage: java -cp ANSERINI_FATJAR LuceneBm25.java IN.tsv RUN.trec TOKENS.tsv K1 B DEPTH
import io.anserini.analysis.AnalyzerUtils;
import io.anserini.analysis.DefaultEnglishAnalyzer;
import io.anserini.search.query.BagOfWordsQueryGenerator;
import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.lucene.analysis.Analyzer;
import org.apache.lucene.document.Document;
import org.apache.lucene.document.Field;
import org.apache.lucene.document.StringField;
import org.apache.lucene.document.TextField;
import org.apache.lucene.index.DirectoryReader;
import org.apache.lucene.index.IndexWriter;
import org.apache.lucene.index.IndexWriterConfig;
import org.apache.lucene.search.IndexSearcher;
import org.apache.lucene.search.Query;
import org.apache.lucene.search.ScoreDoc;
import org.apache.lucene.search.similarities.BM25Similarity;
import org.apache.lucene.store.ByteBuffersDirectory;

public class LuceneBm25 {
  static String unescape(String s) {
    StringBuilder out = new StringBuilder(s.length());
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      if (c == '\\' && i + 1 < s.length()) {
        char n = s.charAt(++i);
        out.append(n == 't' ? '\t' : n == 'n' ? '\n' : n == 'r' ? '\r' : n);
      } else {
        out.append(c);
      }
    }
    return out.toString();
  }

  public static void main(String[] args) throws Exception {
    Path in = Path.of(args[0]);
    float k1 = Float.parseFloat(args[3]);
    float b = Float.parseFloat(args[4]);
    int depth = Integer.parseInt(args[5]);
    Map<String, List<String[]>> docs = new LinkedHashMap<>();
    Map<String, List<String[]>> questions = new LinkedHashMap<>();
    try (BufferedReader r = Files.newBufferedReader(in, StandardCharsets.UTF_8)) {
      String line;
      while ((line = r.readLine()) != null) {
        String[] f = line.split("\t", 4);
        String[] row = {f[2], unescape(f[3])};
        (f[0].equals("D") ? docs : questions).computeIfAbsent(f[1], e -> new ArrayList<>()).add(row);
      }
    }
    Analyzer analyzer = DefaultEnglishAnalyzer.newDefaultInstance();
    BM25Similarity similarity = new BM25Similarity(k1, b);
    BagOfWordsQueryGenerator generator = new BagOfWordsQueryGenerator();
    try (BufferedWriter run = Files.newBufferedWriter(Path.of(args[1]), StandardCharsets.UTF_8);
        BufferedWriter tokens = Files.newBufferedWriter(Path.of(args[2]), StandardCharsets.UTF_8)) {
      for (Map.Entry<String, List<String[]>> e : docs.entrySet()) {
        ByteBuffersDirectory dir = new ByteBuffersDirectory();
        IndexWriterConfig config = new IndexWriterConfig(analyzer).setSimilarity(similarity);
        try (IndexWriter writer = new IndexWriter(dir, config)) {
          for (String[] d : e.getValue()) {
            Document doc = new Document();
            doc.add(new StringField("id", d[0], Field.Store.YES));
            doc.add(new TextField("contents", d[1], Field.Store.NO));
            writer.addDocument(doc);
            tokens.write("D\t" + e.getKey() + "\t" + d[0] + "\t" + String.join(" ", AnalyzerUtils.analyze(analyzer, d[1])) + "\n");
          }
          writer.forceMerge(1);
        }
        try (DirectoryReader reader = DirectoryReader.open(dir)) {
          IndexSearcher searcher = new IndexSearcher(reader);
          searcher.setSimilarity(similarity);
          for (String[] q : questions.getOrDefault(e.getKey(), List.of())) {
            tokens.write("Q\t" + e.getKey() + "\t" + q[0] + "\t" + String.join(" ", AnalyzerUtils.analyze(analyzer, q[1])) + "\n");
            Query query = generator.buildQuery("contents", analyzer, q[1]);
            ScoreDoc[] hits = searcher.search(query, depth).scoreDocs;
            for (int i = 0; i < hits.length; i++) {
              String id = searcher.storedFields().document(hits[i].doc).get("id");
              run.write(q[0] + " Q0 " + id + " " + (i + 1) + " " + String.format(java.util.Locale.ROOT, "%.6f", hits[i].score) + " lucene\n");
            }
          }
        }
      }
    }
  }
}
