package org.jobreg.failover;

import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.connector.source.util.ratelimit.RateLimiterStrategy;
import org.apache.flink.connector.datagen.source.DataGeneratorSource;
import org.apache.flink.core.execution.JobClient;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;
import org.apache.flink.util.Collector;

/**
 * The streaming job of jobreg's Flink failover test and bench: a slow generated stream, keyed
 * state (a running count per key), a checkpoint every 500 ms. It submits itself to a session
 * cluster's REST endpoint and prints the job id on a line of its own ({@code JOBID <hex>}).
 *
 * <p>Arguments: {@code <host> <rest port> <this jar> <job name> [<fail file>]}. With a fail
 * file, the counting task throws once each time that file appears (it deletes it first), so a
 * test can make a task fail and Flink restart the job. With the system property {@code
 * failover.records} = N, the stream is bounded: N records, after which the job FINISHES.
 */
public final class FailoverJob {

    private FailoverJob() {}

    /** Counts the records of each key in keyed state; what a restore brings back. */
    public static final class CountPerKey extends KeyedProcessFunction<Long, Long, Long> {
        private static final long serialVersionUID = 1L;
        private final String failFile;
        private transient ValueState<Long> count;

        public CountPerKey(String failFile) {
            this.failFile = failFile;
        }

        @Override
        public void open(OpenContext context) {
            count = getRuntimeContext().getState(new ValueStateDescriptor<>("count", Types.LONG));
        }

        @Override
        public void processElement(Long value, Context ctx, Collector<Long> out) throws Exception {
            if (failFile != null && java.nio.file.Files.deleteIfExists(
                    java.nio.file.Paths.get(failFile))) {
                throw new RuntimeException("FailoverJob: the test's task failure (" + failFile
                        + ")");
            }
            Long seen = count.value();
            long next = (seen == null ? 0L : seen) + 1L;
            count.update(next);
            out.collect(next);
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 4 && args.length != 5) {
            System.err.println(
                    "usage: FailoverJob <host> <rest port> <jar> <job name> [<fail file>]");
            System.exit(2);
        }
        StreamExecutionEnvironment env = StreamExecutionEnvironment.createRemoteEnvironment(
                args[0], Integer.parseInt(args[1]), args[2]);
        env.setParallelism(1);
        env.enableCheckpointing(500);
        long records = Long.getLong("failover.records", Long.MAX_VALUE);
        DataGeneratorSource<Long> source = new DataGeneratorSource<>(
                index -> index, records, RateLimiterStrategy.perSecond(20), Types.LONG);
        DataStream<Long> numbers =
                env.fromSource(source, WatermarkStrategy.noWatermarks(), "numbers");
        numbers.keyBy(n -> n % 8, Types.LONG)
                .process(new CountPerKey(args.length == 5 ? args[4] : null))
                .returns(Types.LONG)
                .sinkTo(new DiscardingSink<>());
        JobClient client = env.executeAsync(args[3]);
        System.out.println("JOBID " + client.getJobID());
        System.out.flush();
        System.exit(0);
    }
}
