package org.jobreg.failover;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;

import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.connector.source.util.ratelimit.RateLimiterStrategy;
import org.apache.flink.connector.datagen.source.DataGeneratorSource;
import org.apache.flink.core.execution.JobClient;
import org.apache.flink.metrics.Counter;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;
import org.apache.flink.util.Collector;

/**
 * The job of {@code jobreg bench flink-ha}, in the manner of Flink's own end-to-end HA test
 * ({@code flink-end-to-end-tests/test-scripts/test_ha_datastream.sh}, whose
 * DataStreamAllroundTestProgram pairs a sequence generator with a semantics-checking operator):
 * a job with exactly-once state that checks itself, at parallelism 4.
 *
 * <p>The source generates the numbers 0, 1, 2, ... of {@link #COUNT}, split by Flink into one
 * contiguous range per source subtask (each a multiple of {@link #BLOCK} long), each range read
 * in order. Number {@code i} belongs to the key {@code (i / BLOCK) * KEYS + i % KEYS}, so each
 * key's numbers are one arithmetic sequence with step {@link #KEYS}, read in order by one
 * subtask. The verifier keeps, in keyed state, the last number of each key it saw, and checks
 * that the next one is exactly {@link #KEYS} more (a duplicate or a gap otherwise), and that a
 * key's first number is the first of its sequence (else the numbers before it were lost). The
 * source's position and the keyed state are restored from the same checkpoint, so under
 * exactly-once every check passes across task failures and JobManager failovers; a violation
 * is appended as a line to the violations file (and logged).
 *
 * <p>Arguments: {@code <host> <rest port> <this jar> <job name> <fail file> <violations
 * file>}. The verifier throws once each time the fail file appears (it deletes it first): a
 * simulated task failure, after which Flink restores the job from its last checkpoint. With
 * {@code forgetful} the verifier keeps what it saw in a field, not in keyed state: the
 * control, whose checks must fail after the first restore (the bench's {@code --control}).
 */
public final class HaVerifyJob {

    /** How many numbers the source generates: a multiple of {@link #BLOCK} times 1 to 4, 6. */
    public static final long COUNT = 12_000_000_000_000L;
    /** Each source subtask's range starts at a multiple of this. */
    public static final long BLOCK = 1_000_000_000_000L;
    /** Keys per range. */
    public static final long KEYS = 16;

    private HaVerifyJob() {}

    static long keyOf(long number) {
        return (number / BLOCK) * KEYS + number % KEYS;
    }

    /** Checks each key's sequence; counts the records it verified (metric {@code verified}). */
    public static final class Verifier extends KeyedProcessFunction<Long, Long, Long> {
        private static final long serialVersionUID = 1L;
        private final String failFile;
        private final String violations;
        private final boolean forgetful;
        private transient ValueState<Long> last;
        private transient java.util.Map<Long, Long> memory;
        private transient Counter verified;

        public Verifier(String failFile, String violations, boolean forgetful) {
            this.failFile = failFile;
            this.violations = violations;
            this.forgetful = forgetful;
        }

        @Override
        public void open(OpenContext context) {
            last = getRuntimeContext().getState(new ValueStateDescriptor<>("last", Types.LONG));
            memory = new java.util.HashMap<>();
            verified = getRuntimeContext().getMetricGroup().counter("verified");
        }

        @Override
        public void processElement(Long number, Context ctx, Collector<Long> out)
                throws Exception {
            if (Files.deleteIfExists(Paths.get(failFile))) {
                throw new RuntimeException("HaVerifyJob: the simulated task failure ("
                        + failFile + ")");
            }
            Long before = forgetful ? memory.get(ctx.getCurrentKey()) : last.value();
            String wrong = null;
            if (before == null) {
                if (number % BLOCK >= KEYS) {
                    wrong = "the first number of key " + ctx.getCurrentKey() + " is " + number
                            + ": the ones before it were lost";
                }
            } else if (number != before + KEYS) {
                wrong = "key " + ctx.getCurrentKey() + ": " + number + " after " + before
                        + (number <= before ? " (a duplicate)" : " (a gap)");
            }
            if (wrong != null) {
                synchronized (Verifier.class) {
                    Files.write(Path.of(violations),
                            ("HAVERIFY VIOLATION " + wrong + "\n").getBytes(StandardCharsets.UTF_8),
                            StandardOpenOption.CREATE, StandardOpenOption.APPEND);
                }
                System.err.println("HAVERIFY VIOLATION " + wrong);
            }
            if (forgetful) {
                memory.put(ctx.getCurrentKey(), number);
            } else {
                last.update(number);
            }
            verified.inc();
            out.collect(number);
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 6 && !(args.length == 7 && args[6].equals("forgetful"))) {
            System.err.println("usage: HaVerifyJob <host> <rest port> <jar> <job name> "
                    + "<fail file> <violations file> [forgetful]");
            System.exit(2);
        }
        StreamExecutionEnvironment env = StreamExecutionEnvironment.createRemoteEnvironment(
                args[0], Integer.parseInt(args[1]), args[2]);
        env.setParallelism(4);
        env.enableCheckpointing(1000);
        DataGeneratorSource<Long> source = new DataGeneratorSource<>(
                index -> index, COUNT, RateLimiterStrategy.perSecond(40), Types.LONG);
        DataStream<Long> numbers =
                env.fromSource(source, WatermarkStrategy.noWatermarks(), "sequence generator");
        numbers.keyBy(HaVerifyJob::keyOf, Types.LONG)
                .process(new Verifier(args[4], args[5], args.length == 7))
                .name("verifier")
                .returns(Types.LONG)
                .sinkTo(new DiscardingSink<>());
        JobClient client = env.executeAsync(args[3]);
        System.out.println("JOBID " + client.getJobID());
        System.out.flush();
        System.exit(0);
    }
}
