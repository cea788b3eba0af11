// Java hashCode() of boxed key values, as Flink's KeyGroupRangeAssignment sees them (the input of
// MathUtils.murmurHash), for the key types whose Flink assigner uses them. Run with a JDK (11+):
//   java tests/support/JavaHashCodes.java > tests/data/java_hash_codes.json
// tests/test_key_types.py checks statecore's java_hash_code (Python and native) against the file.
import java.util.Arrays;

public class JavaHashCodes {
  static String hex(byte[] b) {
    StringBuilder s = new StringBuilder();
    for (byte x : b) s.append(String.format("%02x", x));
    return s.toString();
  }

  static byte[] unhex(String h) {
    byte[] b = new byte[h.length() / 2];
    for (int i = 0; i < b.length; i++) b[i] = (byte) Integer.parseInt(h.substring(2 * i, 2 * i + 2), 16);
    return b;
  }

  public static void main(String[] args) {
    StringBuilder out = new StringBuilder("{\n");
    out.append(" \"meta\": {\"java_version\": \"" + System.getProperty("java.version")
        + "\", \"generator\": \"tests/support/JavaHashCodes.java\"},\n");
    // float64: Double.hashCode(); values as Java's Double.toString, bits as doubleToRawLongBits.
    String[] doubles = {"0.0", "-0.0", "NaN", "Infinity", "-Infinity", "1.5", "-2.25", "1.0E-310",
                        "4.9E-324", "1.7976931348623157E308", "0.1"};
    out.append(" \"float64\": [");
    for (int i = 0; i < doubles.length; i++) {
      double d = Double.parseDouble(doubles[i]);
      out.append(i == 0 ? "\n" : ",\n").append("  {\"value\": \"" + doubles[i] + "\", \"hashCode\": "
          + Double.valueOf(d).hashCode() + "}");
    }
    // A NaN with a payload: doubleToLongBits canonicalizes it, so it hashes as NaN.
    double payloadNan = Double.longBitsToDouble(0x7ff0000000000001L);
    out.append(",\n  {\"value\": \"NaN\", \"bits\": \"7ff0000000000001\", \"hashCode\": "
        + Double.valueOf(payloadNan).hashCode() + "}");
    out.append("\n ],\n");
    out.append(" \"bool\": [{\"value\": true, \"hashCode\": " + Boolean.TRUE.hashCode()
        + "}, {\"value\": false, \"hashCode\": " + Boolean.FALSE.hashCode() + "}],\n");
    // uint64 / timestamp: Long.hashCode() of the 64 bits (uint64 given as unsigned decimal).
    String[] longs = {"0", "1", "9223372036854775807", "9223372036854775808", "18446744073709551615",
                      "12345678901234567890"};
    out.append(" \"uint64\": [");
    for (int i = 0; i < longs.length; i++) {
      long v = Long.parseUnsignedLong(longs[i]);
      out.append(i == 0 ? "\n" : ",\n").append("  {\"value\": " + longs[i] + ", \"hashCode\": "
          + Long.valueOf(v).hashCode() + "}");
    }
    out.append("\n ],\n");
    long[] micros = {0L, 1L, -1L, 1600000000123456L, -62135596800000000L, Long.MIN_VALUE};
    out.append(" \"timestamp\": [");
    for (int i = 0; i < micros.length; i++) {
      out.append(i == 0 ? "\n" : ",\n").append("  {\"value\": " + micros[i] + ", \"hashCode\": "
          + Long.valueOf(micros[i]).hashCode() + "}");
    }
    out.append("\n ],\n");
    String[] bins = {"", "00", "ff", "deadbeef", "0123456789abcdef0123456789abcdef"};
    out.append(" \"binary\": [");
    for (int i = 0; i < bins.length; i++) {
      out.append(i == 0 ? "\n" : ",\n").append("  {\"value\": \"" + bins[i] + "\", \"hashCode\": "
          + Arrays.hashCode(unhex(bins[i])) + "}");
    }
    out.append("\n ],\n");
    // Multi-column keys: Flink TupleN.hashCode() = fold of 31 * h + field.hashCode() from f0's
    // hash, computed here with the boxed fields' own hashCode().
    Object[][] tuples = {{7, "a"}, {1.5d, true}, {-1L, "k", false}, {"ab", "c"}, {"a", "bc"}};
    out.append(" \"tuple\": [");
    for (int i = 0; i < tuples.length; i++) {
      int h = 0;
      StringBuilder vals = new StringBuilder();
      StringBuilder types = new StringBuilder();
      for (int j = 0; j < tuples[i].length; j++) {
        Object o = tuples[i][j];
        h = 31 * h + o.hashCode();
        String t = o instanceof Integer ? "int32" : o instanceof Long ? "int64"
            : o instanceof Double ? "float64" : o instanceof Boolean ? "bool" : "string";
        vals.append(j == 0 ? "" : ", ").append(o instanceof String ? "\"" + o + "\"" : o.toString());
        types.append(j == 0 ? "" : ", ").append("\"" + t + "\"");
      }
      out.append(i == 0 ? "\n" : ",\n").append("  {\"types\": [" + types + "], \"values\": [" + vals
          + "], \"hashCode\": " + h + "}");
    }
    out.append("\n ]\n}\n");
    System.out.print(out);
  }
}
