/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.configuration.Configuration;
import org.apache.flink.util.concurrent.ExecutorThreadFactory;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ObjectNode;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.lang.management.ManagementFactory;
import java.net.InetAddress;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.Deque;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;

/**
 * One {@code jobreg flink-bridge} child process and the JSON-lines protocol over its stdin and
 * stdout ({@code notes/flink-bridge-protocol.md}).
 *
 * <p>Requests are matched to answers by id, so any thread may call {@link #call}. Events (no id)
 * are dispatched to the registered {@link EventListener}s one at a time, in the order the bridge
 * wrote them, on one dispatcher thread: grants and revocations thus reach the election driver
 * strictly in order, and a listener may make blocking calls (answers are read by another thread).
 * The bridge logs to stderr; its lines are forwarded to this class's logger. The bridge's end
 * (EOF on its stdout) fails every pending request and reaches every listener as {@link
 * EventListener#onBridgeClosed}. An {@code alive} heartbeat goes out every lease/5: the bridge
 * renews its lease only while the heartbeat is fresh, so a paused JVM loses its term.
 */
public class JobregBridge implements AutoCloseable {

    private static final Logger LOG = LoggerFactory.getLogger(JobregBridge.class);

    private static final ObjectMapper MAPPER = new ObjectMapper();

    /** The bridges of this JVM that are running, for hooks Flink creates without a reference. */
    private static final List<JobregBridge> LIVE = new CopyOnWriteArrayList<>();

    /** How long {@link #call} waits for an answer before it gives up (the outcome is unknown). */
    private static final Duration CALL_TIMEOUT = Duration.ofSeconds(60);

    /** How long the bridge may take to connect and say {@code ready}. */
    private static final Duration READY_TIMEOUT = Duration.ofSeconds(60);

    /** A receiver of the bridge's events. */
    public interface EventListener {
        /** One event line of the bridge, e.g. {@code {"event":"granted",...}}. */
        void onEvent(JsonNode event);

        /** The bridge ended (or could not be talked to): no more events will come. */
        void onBridgeClosed(Throwable cause);
    }

    private final List<String> command;
    private final Duration lease;
    private final String namespace;
    private final String contender;

    private final Object writeLock = new Object();
    private final AtomicLong nextId = new AtomicLong(1);
    private final Map<Long, CompletableFuture<JsonNode>> pending = new ConcurrentHashMap<>();
    private final List<EventListener> listeners = new CopyOnWriteArrayList<>();
    private final Map<String, Integer> watchCounts = new HashMap<>();
    private final Map<String, JsonNode> lastLeaderEvents = new ConcurrentHashMap<>();
    private final CompletableFuture<Void> ready = new CompletableFuture<>();
    private final CompletableFuture<Throwable> closedFuture = new CompletableFuture<>();
    private final Deque<String> lastStderr = new ArrayDeque<>();

    private final ExecutorService eventDispatcher;
    private final ScheduledExecutorService heartbeat;

    private Process process;
    private OutputStream stdin;
    private volatile boolean closing;

    private JobregBridge(List<String> command, Duration lease, String namespace, String contender) {
        this.command = command;
        this.lease = lease;
        this.namespace = namespace;
        this.contender = contender;
        this.eventDispatcher =
                Executors.newSingleThreadExecutor(
                        new ExecutorThreadFactory("jobreg-bridge-events-" + contender));
        this.heartbeat =
                Executors.newSingleThreadScheduledExecutor(
                        new ExecutorThreadFactory("jobreg-bridge-heartbeat-" + contender));
    }

    /**
     * Starts the bridge for this configuration with a fresh contender name and waits until it is
     * ready.
     */
    public static JobregBridge start(Configuration configuration) throws IOException {
        JobregHaOptions.bootstrap(configuration);
        String contender = newContenderName();
        JobregBridge bridge =
                new JobregBridge(
                        JobregHaOptions.bridgeCommand(configuration, contender),
                        configuration.get(JobregHaOptions.LEASE),
                        JobregHaOptions.namespace(configuration),
                        contender);
        bridge.startProcess();
        return bridge;
    }

    /** {@code host-pid-xxxxxxxx}: unique per HA-services instance, readable in the audit. */
    static String newContenderName() {
        String host;
        try {
            host = InetAddress.getLocalHost().getHostName();
        } catch (IOException e) {
            host = "localhost";
        }
        long pid = ProcessHandle.current().pid();
        String suffix = UUID.randomUUID().toString().substring(0, 8);
        String name = (host + "-" + pid + "-" + suffix).replaceAll("[^A-Za-z0-9._-]", "-");
        return name.isEmpty() ? ManagementFactory.getRuntimeMXBean().getName() : name;
    }

    public String getNamespace() {
        return namespace;
    }

    public String getContender() {
        return contender;
    }

    public Duration getLease() {
        return lease;
    }

    /**
     * Starts the child from a thread of its own that lives exactly as long as the child. The bridge
     * sets Linux's {@code PR_SET_PDEATHSIG} so that it never outlives its JVM, but Linux sends that
     * signal when the thread that started the child ends, not the process; Flink may build its
     * high-availability services on a thread that ends long before the JVM (a retired pool thread),
     * and the bridge, and with it the leadership, must not end with that thread.
     */
    private Process startOwned(ProcessBuilder builder) throws IOException {
        CompletableFuture<Process> started = new CompletableFuture<>();
        Thread owner =
                new Thread(
                        () -> {
                            Process child;
                            try {
                                child = builder.start();
                            } catch (Throwable t) {
                                started.completeExceptionally(t);
                                return;
                            }
                            started.complete(child);
                            try {
                                child.waitFor();
                            } catch (InterruptedException e) {
                                Thread.currentThread().interrupt();
                            }
                        },
                        "jobreg-bridge-owner-" + contender);
        owner.setDaemon(true);
        owner.start();
        try {
            return started.get();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IOException("interrupted while the jobreg bridge was started", e);
        } catch (ExecutionException e) {
            Throwable cause = e.getCause();
            if (cause instanceof IOException) {
                throw (IOException) cause;
            }
            throw new IOException(String.valueOf(cause), cause);
        }
    }

    private void startProcess() throws IOException {
        LOG.info("Starting the jobreg bridge: {}", String.join(" ", command));
        ProcessBuilder builder = new ProcessBuilder(command);
        builder.redirectInput(ProcessBuilder.Redirect.PIPE);
        builder.redirectOutput(ProcessBuilder.Redirect.PIPE);
        builder.redirectError(ProcessBuilder.Redirect.PIPE);
        try {
            process = startOwned(builder);
        } catch (IOException e) {
            throw new IOException(
                    "cannot start the jobreg bridge ("
                            + String.join(" ", command)
                            + "): "
                            + e.getMessage()
                            + " (see "
                            + JobregHaOptions.COMMAND.key()
                            + ")",
                    e);
        }
        stdin = process.getOutputStream();
        Thread stdoutReader = new Thread(this::readStdout, "jobreg-bridge-stdout-" + contender);
        stdoutReader.setDaemon(true);
        stdoutReader.start();
        Thread stderrReader = new Thread(this::readStderr, "jobreg-bridge-stderr-" + contender);
        stderrReader.setDaemon(true);
        stderrReader.start();

        try {
            ready.get(READY_TIMEOUT.toMillis(), TimeUnit.MILLISECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            destroy();
            throw new IOException("interrupted while the jobreg bridge started", e);
        } catch (ExecutionException | TimeoutException e) {
            destroy();
            throw new IOException(
                    "the jobreg bridge did not start: " + describeFailure(e.getCause()), e);
        }
        LIVE.add(this);
        long period = Math.max(50, lease.toMillis() / 5);
        heartbeat.scheduleAtFixedRate(this::sendAlive, 0, period, TimeUnit.MILLISECONDS);
        LOG.info(
                "The jobreg bridge (pid {}) is ready: namespace {}, contender {}.",
                process.pid(),
                namespace,
                contender);
    }

    private String describeFailure(Throwable cause) {
        String stderr;
        synchronized (lastStderr) {
            stderr = lastStderr.isEmpty() ? "" : lastStderr.peekLast();
        }
        if (!stderr.isEmpty()) {
            return stderr;
        }
        return cause == null ? "no answer" : String.valueOf(cause.getMessage());
    }

    /** The running bridges of this JVM for a namespace. */
    /** Every live bridge of this JVM, of any namespace. */
    static List<JobregBridge> liveBridges() {
        List<JobregBridge> bridges = new java.util.ArrayList<>();
        for (JobregBridge bridge : LIVE) {
            if (!bridge.closedFuture.isDone()) {
                bridges.add(bridge);
            }
        }
        return bridges;
    }

    static List<JobregBridge> liveBridges(String namespace) {
        List<JobregBridge> bridges = new java.util.ArrayList<>();
        for (JobregBridge bridge : LIVE) {
            if (bridge.namespace.equals(namespace) && !bridge.closedFuture.isDone()) {
                bridges.add(bridge);
            }
        }
        return bridges;
    }

    /** The pid of the child process (tests pause or kill it). */
    public long pid() {
        return process.pid();
    }

    /** Completes when the bridge has ended, with the cause. */
    public CompletableFuture<Throwable> closedFuture() {
        return closedFuture;
    }

    public void addListener(EventListener listener) {
        listeners.add(listener);
    }

    public void removeListener(EventListener listener) {
        listeners.remove(listener);
    }

    // ------------------------------------------------------------------------------------------
    // Requests
    // ------------------------------------------------------------------------------------------

    /** A new request object for {@code op}; add arguments, then pass it to {@link #call}. */
    public static ObjectNode request(String op) {
        ObjectNode node = MAPPER.createObjectNode();
        node.put("op", op);
        return node;
    }

    /** Sends a request and returns its answer's {@code result} (or the error) asynchronously. */
    public CompletableFuture<JsonNode> callAsync(ObjectNode request) {
        long id = nextId.getAndIncrement();
        request.put("id", id);
        CompletableFuture<JsonNode> answer = new CompletableFuture<>();
        if (closedFuture.isDone()) {
            answer.completeExceptionally(
                    new JobregBridgeException(
                            JobregBridgeException.UNAVAILABLE, "the jobreg bridge has ended"));
            return answer;
        }
        pending.put(id, answer);
        try {
            send(request);
        } catch (IOException e) {
            pending.remove(id);
            answer.completeExceptionally(
                    new JobregBridgeException(
                            JobregBridgeException.UNAVAILABLE,
                            "cannot write to the jobreg bridge: " + e.getMessage()));
        }
        // A closed bridge fails what is pending: close the race with onClosed's sweep.
        if (closedFuture.isDone() && pending.remove(id) != null) {
            answer.completeExceptionally(
                    new JobregBridgeException(
                            JobregBridgeException.UNAVAILABLE, "the jobreg bridge has ended"));
        }
        return answer;
    }

    /**
     * Sends a request and waits for its answer. A timeout is an unknown outcome: the request may
     * still be applied.
     */
    public JsonNode call(ObjectNode request) throws JobregBridgeException, InterruptedException {
        CompletableFuture<JsonNode> answer = callAsync(request);
        try {
            return answer.get(CALL_TIMEOUT.toMillis(), TimeUnit.MILLISECONDS);
        } catch (ExecutionException e) {
            if (e.getCause() instanceof JobregBridgeException) {
                throw (JobregBridgeException) e.getCause();
            }
            throw new JobregBridgeException("Internal", String.valueOf(e.getCause()));
        } catch (TimeoutException e) {
            LOG.warn(
                    "No answer from the jobreg bridge to {} within {} s",
                    request,
                    CALL_TIMEOUT.toSeconds());
            throw new JobregBridgeException(
                    JobregBridgeException.OUTCOME_UNKNOWN,
                    "no answer from the jobreg bridge to "
                            + request.path("op").asText()
                            + " within "
                            + CALL_TIMEOUT.toSeconds()
                            + " s");
        }
    }

    /** {@link #call} for callers that may not be interrupted (Flink's SPI methods). */
    public JsonNode callUninterruptibly(ObjectNode request) throws JobregBridgeException {
        try {
            return call(request);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new JobregBridgeException(
                    JobregBridgeException.OUTCOME_UNKNOWN, "interrupted while waiting for jobreg");
        }
    }

    private void send(JsonNode message) throws IOException {
        String text = MAPPER.writeValueAsString(message);
        if (LOG.isDebugEnabled() && message.has("id")) {
            LOG.debug("-> {}", text);
        }
        byte[] line = (text + "\n").getBytes(StandardCharsets.UTF_8);
        synchronized (writeLock) {
            stdin.write(line);
            stdin.flush();
        }
    }

    private void sendAlive() {
        if (closedFuture.isDone() || closing) {
            return;
        }
        try {
            send(request("alive"));
        } catch (IOException e) {
            LOG.debug("Cannot send the heartbeat to the jobreg bridge", e);
        }
    }

    // ------------------------------------------------------------------------------------------
    // Watches (reference counted: the election driver and retrievers may watch one component)
    // ------------------------------------------------------------------------------------------

    /**
     * Watches a component's leader information; {@code leader} events follow. A second watcher of
     * the same component gets the last known value at once (the bridge sends it only once).
     */
    public void watch(String component) throws JobregBridgeException {
        boolean first;
        synchronized (watchCounts) {
            int count = watchCounts.getOrDefault(component, 0);
            watchCounts.put(component, count + 1);
            first = count == 0;
        }
        if (first) {
            ObjectNode request = request("watch");
            request.put("component", component);
            try {
                callUninterruptibly(request);
            } catch (JobregBridgeException e) {
                synchronized (watchCounts) {
                    watchCounts.merge(component, -1, Integer::sum);
                    watchCounts.remove(component, 0);
                }
                throw e;
            }
        } else {
            JsonNode last = lastLeaderEvents.get(component);
            if (last != null) {
                submitEvent(() -> dispatch(last));
            }
        }
    }

    /** Ends one watch of the component; the last one unwatches it at the bridge. */
    public void unwatch(String component) {
        boolean last;
        synchronized (watchCounts) {
            Integer count = watchCounts.get(component);
            if (count == null) {
                return;
            }
            last = count == 1;
            if (last) {
                watchCounts.remove(component);
                lastLeaderEvents.remove(component);
            } else {
                watchCounts.put(component, count - 1);
            }
        }
        if (last && !closedFuture.isDone()) {
            ObjectNode request = request("unwatch");
            request.put("component", component);
            callAsync(request)
                    .exceptionally(
                            e -> {
                                LOG.debug("unwatch {} failed", component, e);
                                return null;
                            });
        }
    }

    // ------------------------------------------------------------------------------------------
    // Reading
    // ------------------------------------------------------------------------------------------

    private void readStdout() {
        Throwable cause = null;
        try (BufferedReader reader =
                new BufferedReader(
                        new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
            String line;
            while ((line = reader.readLine()) != null) {
                if (line.isBlank()) {
                    continue;
                }
                JsonNode message;
                try {
                    message = MAPPER.readTree(line);
                } catch (IOException e) {
                    LOG.warn("The jobreg bridge wrote a line that is not JSON: {}", line);
                    continue;
                }
                handle(message);
            }
        } catch (IOException e) {
            cause = e;
        }
        onClosed(cause);
    }

    private void handle(JsonNode message) {
        LOG.debug("<- {}", message);
        if (message.has("id") && !message.get("id").isNull()) {
            CompletableFuture<JsonNode> answer = pending.remove(message.get("id").asLong());
            if (answer == null) {
                LOG.warn("An answer of the jobreg bridge matches no request: {}", message);
                return;
            }
            if (message.path("ok").asBoolean(false)) {
                answer.complete(message.get("result"));
            } else {
                answer.completeExceptionally(
                        new JobregBridgeException(
                                message.path("error").asText("Internal"),
                                message.path("message").asText("")));
            }
            return;
        }
        String event = message.path("event").asText("");
        if ("ready".equals(event)) {
            ready.complete(null);
            return;
        }
        if ("leader".equals(event)) {
            lastLeaderEvents.put(message.path("component").asText(), message);
        }
        submitEvent(() -> dispatch(message));
    }

    private void submitEvent(Runnable task) {
        try {
            eventDispatcher.execute(task);
        } catch (java.util.concurrent.RejectedExecutionException e) {
            LOG.debug("An event of the jobreg bridge came after its end", e);
        }
    }

    private void dispatch(JsonNode event) {
        for (EventListener listener : listeners) {
            try {
                listener.onEvent(event);
            } catch (Throwable t) {
                LOG.error("A listener of the jobreg bridge failed on {}", event, t);
            }
        }
    }

    private void readStderr() {
        try (BufferedReader reader =
                new BufferedReader(
                        new InputStreamReader(process.getErrorStream(), StandardCharsets.UTF_8))) {
            String line;
            while ((line = reader.readLine()) != null) {
                synchronized (lastStderr) {
                    lastStderr.addLast(line);
                    if (lastStderr.size() > 20) {
                        lastStderr.removeFirst();
                    }
                }
                LOG.info("[jobreg bridge {}] {}", contender, line);
            }
        } catch (IOException e) {
            LOG.debug("The jobreg bridge's stderr ended", e);
        }
    }

    private void onClosed(Throwable readError) {
        Integer exitCode = null;
        try {
            if (process.waitFor(5, TimeUnit.SECONDS)) {
                exitCode = process.exitValue();
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        String description =
                "the jobreg bridge (pid "
                        + process.pid()
                        + ") ended"
                        + (exitCode == null ? "" : " with exit code " + exitCode)
                        + (readError == null ? "" : ": " + readError.getMessage());
        String stderr = describeFailure(null);
        if (!stderr.isEmpty() && !"no answer".equals(stderr)) {
            description += " (last stderr line: " + stderr + ")";
        }
        JobregBridgeException cause =
                new JobregBridgeException(JobregBridgeException.UNAVAILABLE, description);
        LIVE.remove(this);
        closedFuture.complete(cause);
        ready.completeExceptionally(cause);
        for (Long id : pending.keySet()) {
            CompletableFuture<JsonNode> answer = pending.remove(id);
            if (answer != null) {
                answer.completeExceptionally(cause);
            }
        }
        if (closing) {
            LOG.info("{}", description);
        } else {
            LOG.error("{}", description);
        }
        final boolean expected = closing;
        submitEvent(
                () -> {
                    for (EventListener listener : listeners) {
                        try {
                            listener.onBridgeClosed(expected ? null : cause);
                        } catch (Throwable t) {
                            LOG.error("A listener of the jobreg bridge failed on its end", t);
                        }
                    }
                });
        eventDispatcher.shutdown();
        heartbeat.shutdownNow();
    }

    /**
     * Ends the bridge: closing its stdin makes it revoke any term it holds and exit 0. Waits a
     * while, then kills it.
     */
    @Override
    public void close() {
        closing = true;
        LIVE.remove(this);
        heartbeat.shutdownNow();
        try {
            synchronized (writeLock) {
                stdin.close();
            }
        } catch (IOException e) {
            LOG.debug("Closing the jobreg bridge's stdin failed", e);
        }
        try {
            if (!process.waitFor(10, TimeUnit.SECONDS)) {
                LOG.warn("The jobreg bridge did not exit within 10 s after EOF; ending it");
                destroy();
            }
            closedFuture.get(10, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            destroy();
        } catch (ExecutionException | TimeoutException e) {
            LOG.debug("The jobreg bridge's reader did not finish", e);
        }
        eventDispatcher.shutdown();
    }

    private void destroy() {
        if (process == null) {
            return;
        }
        process.destroy();
        try {
            if (!process.waitFor(5, TimeUnit.SECONDS)) {
                process.destroyForcibly();
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            process.destroyForcibly();
        }
    }
}
