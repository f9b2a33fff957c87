/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.junit.jupiter.api.extension.AfterAllCallback;
import org.junit.jupiter.api.extension.BeforeAllCallback;
import org.junit.jupiter.api.extension.ExtensionContext;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.Deque;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

/**
 * A Kafka broker for a test class: the system property {@code jobreg.bootstrap} when set (an
 * existing broker), otherwise jobreg's embedded broker, started as {@code ${jobreg.python} -m
 * registry broker} (it picks a free 127.0.0.1 port and prints {@code bootstrap: HOST:PORT} once it
 * answers) and stopped by its process handle (SIGTERM, which it handles by stopping the broker).
 *
 * <p>Use it with {@code @RegisterExtension static final JobregBrokerExtension BROKER = ...}.
 */
public class JobregBrokerExtension implements BeforeAllCallback, AfterAllCallback {

    private static final long START_TIMEOUT_SECONDS = 120;

    private Process process;
    private String bootstrap;

    /** The python that has jobreg installed (system property {@code jobreg.python}). */
    public static String python() {
        String python = System.getProperty("jobreg.python", "");
        if (python.isBlank()) {
            python = new File("../.venv/bin/python").getAbsolutePath();
        }
        return python;
    }

    /** The command that runs jobreg for the bridge ({@code high-availability.jobreg.command}). */
    public static String jobregCommand() {
        return python() + " -m registry";
    }

    public String getBootstrap() {
        if (bootstrap == null) {
            throw new IllegalStateException("the broker is not running");
        }
        return bootstrap;
    }

    @Override
    public void beforeAll(ExtensionContext context) throws Exception {
        String given = System.getProperty("jobreg.bootstrap", "");
        if (!given.isBlank()) {
            bootstrap = given.trim();
            return;
        }
        ProcessBuilder builder =
                new ProcessBuilder(List.of(python(), "-m", "registry", "broker"))
                        .redirectErrorStream(true);
        process = builder.start();
        CompletableFuture<String> announced = new CompletableFuture<>();
        Deque<String> output = new ArrayDeque<>();
        Thread reader =
                new Thread(
                        () -> {
                            try (BufferedReader lines =
                                    new BufferedReader(
                                            new InputStreamReader(
                                                    process.getInputStream(),
                                                    StandardCharsets.UTF_8))) {
                                String line;
                                while ((line = lines.readLine()) != null) {
                                    synchronized (output) {
                                        output.addLast(line);
                                        if (output.size() > 30) {
                                            output.removeFirst();
                                        }
                                    }
                                    if (line.startsWith("bootstrap: ")) {
                                        announced.complete(line.substring(11).trim());
                                    }
                                }
                            } catch (IOException e) {
                                // The broker ended; handled below.
                            }
                            announced.completeExceptionally(
                                    new IllegalStateException("the broker ended"));
                        },
                        "jobreg-test-broker-output");
        reader.setDaemon(true);
        reader.start();
        try {
            bootstrap = announced.get(START_TIMEOUT_SECONDS, TimeUnit.SECONDS);
        } catch (Exception e) {
            stop();
            String lines;
            synchronized (output) {
                lines = String.join("\n", output);
            }
            throw new IllegalStateException(
                    "jobreg's embedded broker did not start (" + python() + "):\n" + lines, e);
        }
    }

    @Override
    public void afterAll(ExtensionContext context) throws Exception {
        stop();
    }

    private void stop() throws InterruptedException {
        if (process == null) {
            return;
        }
        process.destroy();
        if (!process.waitFor(30, TimeUnit.SECONDS)) {
            process.destroyForcibly();
            process.waitFor(10, TimeUnit.SECONDS);
        }
        process = null;
    }
}
