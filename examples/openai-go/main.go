// Command openai-go shows the wiring: an openai-go client whose model calls
// go through a lane of 6 slots, as an interactive call.
//
//	OPENAI_BASE_URL=https://gw/v1 OPENAI_API_KEY=... go run ./examples/openai-go
package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
)

func main() {
	lim, _ := limiter.New(limiter.Config{MaxInflight: 6, QueueTimeout: 5 * time.Minute, InteractiveReserve: 1})
	lanes := &lanehttp.Transport{Limiter: lim, ResponseHeaderTimeout: 2 * time.Minute, StallTimeout: 2 * time.Minute}
	// No WithRequestTimeout: it would count the queue wait. The lane bounds the wait; the transport the exchange.
	client := openai.NewClient(option.WithHTTPClient(&http.Client{Transport: lanes})) // base URL and key from the environment

	// The SDK's retries keep this call's place in line: the transport knows them.
	ctx := limiter.WithPriority(context.Background(), limiter.Interactive)
	reply, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:    os.Getenv("MODEL"),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello.")},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(reply.Choices[0].Message.Content)
}
